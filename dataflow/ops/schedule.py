"""``LearningRateSchedule``: a schedule's rate at the global step, as a scalar tensor.

The op holds a schedule of ``dataflow/schedules.py`` as attrs (its ``kind``
and fields, so a GraphDef carries it) and its kernels call that schedule's
``value(step)``: the one definition a parameter server calls too. The step
is an int scalar (the ``global_step`` variable); the rate has the dtype of
the variables it updates. It has no gradient: a step count is not trained.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..dtypes import INTS, is_float
from ..graph import Node, Tensor
from ..kernels.cuda import cuda_kernel
from ..opdef import InferContext, KernelContext, OpDef, TensorSpec, not_differentiable, register_op
from ..schedules import Schedule, schedule_from_fields
from ..shapes import fmt
from .base import TensorLike, apply, as_tensor

FAMILY = "training"


def schedule_of(attrs: dict[str, Any]) -> Schedule:
    """The schedule an op's attrs describe (its ``schedule`` kind and its fields)."""
    return schedule_from_fields(attrs["schedule"], attrs)


def rate(schedule: Schedule, step: Any, dtype: str) -> np.ndarray:
    """``schedule.value(step)`` as a 0-d array of ``dtype``: evaluated in float64, then cast once."""
    return np.asarray(schedule.value(int(step)), dtype=dtype)


def _infer(ctx: InferContext) -> TensorSpec:
    step = ctx.inputs[0]
    if step.dtype not in INTS:
        raise ctx.dtype_error(f"the step must be an int32 or int64 scalar, got {step.dtype}")
    if step.shape != ():
        raise ctx.shape_error(f"the step must be a scalar, got shape {fmt(step.shape)}")
    if not is_float(ctx.attrs["dtype"]):
        raise ctx.dtype_error(f"a learning rate must be a float, got dtype {ctx.attrs['dtype']}")
    try:
        schedule_of(ctx.attrs)
    except ValueError as err:
        raise ctx.graph_error(str(err)) from None
    return TensorSpec((), ctx.attrs["dtype"])


def _cpu(node: Node, ctx: KernelContext) -> Any:
    schedule, dtype = schedule_of(node.attrs), node.attrs["dtype"]
    return lambda step: rate(schedule, step, dtype)


register_op(OpDef(
    name="LearningRateSchedule", family=FAMILY, infer=_infer,
    reference=lambda attrs, step: rate(schedule_of(attrs), step, attrs["dtype"]),
    grad=not_differentiable,
    kernels={"cpu": _cpu, "cuda": cuda_kernel("schedule", "learning_rate_op")},
))  # fmt: skip


def learning_rate_schedule(
    schedule: Schedule, step: TensorLike, dtype: str = "float32", name: str = "learning_rate"
) -> Tensor:
    """The rate ``schedule`` gives at global step ``step`` (an int scalar tensor), as a ``dtype`` scalar.

    Examples
    --------
    >>> import cellgraph as cg
    >>> from cellgraph.dataflow.ops.schedule import learning_rate_schedule
    >>> g = cg.Graph()
    >>> with g.as_default():
    ...     step = cg.variable(10, dtype="int32", name="global_step", trainable=False)
    ...     lr = learning_rate_schedule(cg.optim.exponential_decay(1.0, 10, 0.5), step)
    >>> float(cg.Session(g).run(lr))
    0.5
    """
    if not isinstance(schedule, Schedule):
        raise TypeError(f"learning_rate_schedule: schedule must be a cg.optim schedule, got {schedule!r}")
    attrs = {"schedule": schedule.kind, "dtype": dtype, **schedule.fields()}
    return apply("LearningRateSchedule", [as_tensor(step)], attrs, name=name)


__all__ = ["learning_rate_schedule"]
