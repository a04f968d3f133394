"""Mixed-precision training: float32 master weights, half-precision compute, a dynamic loss scale.

``mixed_precision(optimizer)`` wraps any optimizer. The variables stay float32
(the master weights); the forward pass reads them through ``cast`` (float16 by
default, bfloat16 on request), so matmuls, activations and their gradients are
stored in half precision. The loss (float32) is multiplied by the loss scale
before differentiation, so that small gradients survive float16's range; the
gradients arrive at the float32 variables through each cast's gradient, and are
divided by the scale in float32.

A step whose gradients hold an inf or NaN (the scale was too large: float16
overflowed) is skipped: every variable and optimizer slot keeps its value from
before the step, the scale is halved, and a ``LossScaleWarning`` names the step
and the new scale. After ``growth_interval`` finite steps in a row, the scale
doubles. The scale and counters are non-trainable variables (``loss_scale``,
``loss_scale/good_steps``, ``loss_scale/steps``) of the graph.

Skipping costs one copy of each variable and slot per step (taken before the
update, put back when the step was not finite): the updates of every optimizer
kind run unchanged. This runs in a local ``Session`` (CPU): the loss-scale op
has no CUDA kernel, and the parameter servers apply plain optimizers.

Examples
--------
>>> import numpy as np
>>> import cellgraph as cg
>>> g = cg.Graph()
>>> with g.as_default():
...     x = cg.placeholder((None, 2), name="x")
...     w = cg.variable([[1.0], [2.0]], name="w")
...     mp = cg.optim.mixed_precision(cg.optim.SGD(0.1), initial_scale=1024)
...     y = cg.cast(cg.matmul(mp.cast(x), mp.cast(w)), "float32")
...     train = mp.minimize(cg.reduce_mean(cg.square(y)))
>>> sess = cg.Session(g)
>>> _ = sess.run(train, {x: np.ones((4, 2), np.float32)})
>>> sess.run(w).ravel().tolist()
[0.3999999761581421, 1.399999976158142]
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from .cells import CellgraphWarning
from .dtypes import FLOATS, HALF_FLOATS, as_dtype
from .errors import DTypeError, GradientError, GraphError
from .graph import Graph, Node, Tensor
from .opdef import InferContext, KernelContext, OpDef, TensorSpec, not_differentiable, register_op
from .ops.base import TensorLike, apply, as_tensor
from .ops.logic import is_finite, logical_and
from .ops.math import cast, div, mul
from .ops.math_unary import where
from .ops.reductions import reduce_all
from .ops.state import assign, assign_add, group, variable
from .optimizers import Optimizer


class LossScaleWarning(CellgraphWarning):
    """A mixed-precision step was skipped: a gradient was not finite. ``step`` and ``scale`` (the new one) say which."""

    def __init__(self, step: int, previous: float, scale: float) -> None:
        super().__init__(
            f"mixed precision: step {step} skipped (a gradient is inf or NaN: float16 overflowed); "
            f"the loss scale goes from {previous:g} to {scale:g}"
        )
        self.step, self.previous, self.scale = step, previous, scale


# ------------------------------------------------------------ UpdateLossScale
def _infer_update_scale(ctx: InferContext) -> TensorSpec:
    scale, good, steps, finite = ctx.inputs
    for i, what in ((0, "loss scale"), (1, "good-step counter"), (2, "step counter")):
        if ctx.node.inputs[i].node.op != "Variable":
            raise ctx.graph_error(f"the {what} must be a variable, got {ctx.node.inputs[i].node.describe()}")
    wanted = (("loss scale", scale, "float32"), ("good-step counter", good, "int64"), ("step counter", steps, "int64"),
              ("finite flag", finite, "bool"))  # fmt: skip
    for what, spec, dtype in wanted:
        if spec.dtype != dtype or spec.shape != ():
            raise ctx.dtype_error(f"the {what} must be a {dtype} scalar, got {spec.dtype} of shape {spec.shape}")
    return scale


# The scale is a float32 variable: a doubling past this is stored as inf, and an inf scale makes every later
# step's gradients NaN (skipped, the scale halved to inf again) for ever. torch.amp's GradScaler also checks
# the doubled scale in float32 and keeps the old one.
_MAX_SCALE = float(np.finfo(np.float32).max)


def _next_scale(scale: float, good: int, finite: bool, interval: int) -> tuple[float, int]:
    """The loss scale and good-step count after one step: the one rule, for kernel and reference alike."""
    if not finite:
        return scale / 2, 0
    good += 1
    if good >= interval and scale * 2 <= _MAX_SCALE:
        return scale * 2, 0
    return scale, good if good < interval else 0


def _ref_update_scale(attrs: dict[str, Any], scale: Any, good: Any, steps: Any, finite: Any) -> np.ndarray:
    new, _ = _next_scale(float(scale), int(good), bool(finite), attrs["growth_interval"])
    return np.asarray(new, np.float32)


def _update_scale_kernel(node: Node, ctx: KernelContext) -> Any:
    interval = int(node.attrs["growth_interval"])

    def run(scale: np.ndarray, good: np.ndarray, steps: np.ndarray, finite: np.ndarray) -> np.ndarray:
        steps[...] += 1
        previous = float(scale)
        new, good[...] = _next_scale(previous, int(good), bool(finite), interval)
        scale[...] = new
        if not finite:
            warnings.warn(LossScaleWarning(int(steps), previous, new), stacklevel=2)
        return scale

    return run


register_op(OpDef(
    name="UpdateLossScale", family="training", infer=_infer_update_scale, reference=_ref_update_scale,
    grad=not_differentiable, kernels={"cpu": _update_scale_kernel}, stateful=True, view=True,
))  # fmt: skip


# ------------------------------------------------------------ the wrapper
class MixedPrecision:
    """``optimizer`` with float32 master weights and a dynamic loss scale; made by :func:`mixed_precision`."""

    def __init__(self, optimizer: Optimizer, initial_scale: float, growth_interval: int, compute_dtype: str) -> None:
        self.optimizer = optimizer
        self.initial_scale = initial_scale
        self.growth_interval = growth_interval
        self.compute_dtype = compute_dtype
        self.loss_scale: Tensor | None = None  # the scale variable, once minimize or compute_gradients made it
        self.gradients_finite: Tensor | None = None  # whether every unscaled gradient of that step is finite
        self._unscaled: list[Tensor] = []  # the gradients gradients_finite checked
        # The scale and its two counters, made once: every training op of this wrapper (two losses trained by
        # turns) reads and moves the one scale, as one torch.amp.GradScaler (or Keras LossScaleOptimizer) does.
        self._scale_state: tuple[Tensor, Tensor, Tensor] | None = None

    @property
    def name(self) -> str:
        return f"mixed_precision({self.optimizer.name})"

    def __repr__(self) -> str:
        return (
            f"mixed_precision({self.optimizer!r}, initial_scale={self.initial_scale:g}, "
            f"growth_interval={self.growth_interval}, compute_dtype={self.compute_dtype!r})"
        )

    def cast(self, x: TensorLike, name: str = "half") -> Tensor:
        """``x`` in the compute dtype, for the forward pass: ``cg.matmul(mp.cast(x), mp.cast(w))``."""
        t = as_tensor(x)
        return t if t.dtype == self.compute_dtype else cast(t, self.compute_dtype, name=name)

    def minimize(
        self, loss: Tensor, var_list: Sequence[Tensor] | None = None, global_step: Tensor | None = None
    ) -> Node:
        """The training op: scale ``loss``, differentiate, unscale in float32, apply unless a gradient is not finite."""
        graph = loss.graph
        with graph.atomic(), graph.name_scope(self._scope):
            pairs = self._unscaled_gradients(loss, var_list)
            return self._apply(pairs, global_step)

    def compute_gradients(
        self, loss: Tensor, var_list: Sequence[Tensor] | None = None
    ) -> list[tuple[Tensor | None, Tensor]]:
        """The ``(gradient, variable)`` pairs of ``loss``, unscaled (float32), for clipping before ``apply_gradients``.

        As ``scaler.unscale_(optimizer)`` in PyTorch and Keras's
        ``LossScaleOptimizer.get_unscaled_gradients``: the loss is scaled and
        differentiated, and each gradient divided by the scale, so
        ``clip_by_global_norm`` sees the true norm. ``gradients_finite`` (a
        bool tensor) says whether every unscaled gradient is finite, and
        ``loss_scale`` is the scale; ``apply_gradients`` skips the step when
        either those or the gradients it is given are not finite.

        Examples
        --------
        >>> import numpy as np
        >>> import cellgraph as cg
        >>> g = cg.Graph()
        >>> with g.as_default():
        ...     w = cg.variable([[3.0], [4.0]], name="w")
        ...     mp = cg.optim.mixed_precision(cg.optim.SGD(0.5))
        ...     loss = cg.reduce_sum(cg.cast(cg.matmul(mp.cast(cg.constant([[1.0, 1.0]])), mp.cast(w)), "float32"))
        ...     grads_and_vars = mp.compute_gradients(loss)
        ...     (clipped,), norm = cg.optim.clip_by_global_norm([grads_and_vars[0][0]], 1.0)
        ...     train = mp.apply_gradients([(clipped, w)])
        >>> sess = cg.Session(g)
        >>> _ = sess.run(train)
        >>> print(sess.run(w).ravel().round(4), round(float(sess.run(norm)), 4))  # gradient (1, 1): norm 1.4142
        [2.6464 3.6464] 1.4142
        """
        with loss.graph.atomic(), loss.graph.name_scope(self._scope):
            return [(g, v) for g, v in self._unscaled_gradients(loss, var_list)]

    def apply_gradients(
        self,
        grads_and_vars: Sequence[tuple[Tensor | None, Tensor]],
        global_step: Tensor | None = None,
        name: str | None = None,
    ) -> Node:
        """Apply unscaled ``grads_and_vars`` (from ``compute_gradients``, clipped or not) unless the step overflowed.

        The step is skipped (every variable and slot kept, the scale halved, a
        ``LossScaleWarning``) when an unscaled gradient of ``compute_gradients``
        or one given here is inf or NaN, as ``scaler.step`` skips on the inf
        that ``unscale_`` found.
        """
        if self.loss_scale is None or self.gradients_finite is None:
            raise GraphError(
                f"{self.name}.apply_gradients: no loss scale yet: call compute_gradients(loss) on this wrapper "
                "first (it scales the loss and gives the unscaled gradients to clip and apply)"
            )
        present = [(g, v) for g, v in grads_and_vars if g is not None]
        graph = self.loss_scale.graph
        for g, v in present:
            if g.graph is not graph or v.graph is not graph:
                raise GraphError(
                    f"{self.name}.apply_gradients: gradient {g.name!r} of {v.name!r} is not in the graph of the "
                    f"loss scale {self.loss_scale.name!r}; call compute_gradients(loss) in this graph first"
                )
        # Without a name, the update joins the scope of compute_gradients, whose nodes it reads (as minimize's do):
        # a scope of its own made a second box, "mixed_precision_Adam_1", beside the first in GraphView.
        made_in = self.loss_scale.name.rpartition("/")[0]
        scope = (
            graph.name_scope(made_in, reopen=True) if made_in and not name else graph.name_scope(name or self._scope)
        )
        with graph.atomic(), scope:
            return self._apply(list(grads_and_vars), global_step)

    @property
    def _scope(self) -> str:
        return self.name.replace("(", "_").replace(")", "")

    def _scale_variables(self, graph: Graph) -> tuple[Tensor, Tensor, Tensor]:
        """The loss scale and its good-step and step counters: those this wrapper made while they are still in
        ``graph`` (a re-run cell or a rejected build takes them out), else new ones."""
        known = self._scale_state
        if known is not None and all(t in graph for t in known):
            return known
        self._scale_state = (
            variable(np.float32(self.initial_scale), dtype="float32", name="loss_scale", trainable=False),
            variable(np.int64(0), dtype="int64", name="loss_scale/good_steps", trainable=False),
            variable(np.int64(0), dtype="int64", name="loss_scale/steps", trainable=False),
        )
        return self._scale_state

    def _unscaled_gradients(self, loss: Tensor, var_list: Sequence[Tensor] | None) -> list[tuple[Tensor, Tensor]]:
        """Scale ``loss``, differentiate, divide each gradient by the scale; sets ``loss_scale`` and
        ``gradients_finite``. The pairs with a gradient, in the variables' order."""
        if loss.dtype not in FLOATS - HALF_FLOATS or loss.shape != ():
            raise DTypeError(
                f"{self.name}: the loss {loss.name!r} must be a float32 or float64 scalar, got {loss.dtype} of "
                f"shape {loss.shape}; cast the logits to float32 (cg.cast(logits, 'float32')) before the loss"
            )
        scale = self._scale_variables(loss.graph)[0]
        scaled = mul(cast(loss, "float32") if loss.dtype != "float32" else loss, scale, name="scaled_loss")
        pairs = self.optimizer.compute_gradients(scaled, var_list)
        for _, var in pairs:
            if var.dtype not in ("float32", "float64"):
                raise DTypeError(
                    f"{self.name}: variable {var.node.name!r} is {var.dtype}; mixed precision keeps float32 "
                    f"master weights: make it float32 and read it as {self.compute_dtype} with mp.cast(...), or "
                    f"build the layers under cg.layers.policy('mixed_{self.compute_dtype}')"
                )
        present = [(g, v) for g, v in pairs if g is not None]
        if not present:
            names = ", ".join(v.name for _, v in pairs)
            raise GradientError(f"{self.optimizer.name}: no gradient flows to any of {names}")
        # Unscaled in the variable's precision: a float32 gradient divided by a float32 scale.
        grads = [div(g, scale if v.dtype == "float32" else cast(scale, v.dtype), name="unscaled") for g, v in present]
        self.loss_scale, self.gradients_finite, self._unscaled = scale, _all_finite(grads), grads
        return [(g, v) for g, (_, v) in zip(grads, present)]

    def _apply(self, grads_and_vars: Sequence[tuple[Tensor | None, Tensor]], global_step: Tensor | None) -> Node:
        """The update of unscaled ``grads_and_vars``, put back unless the step's gradients are finite."""
        scale, finite = self.loss_scale, self.gradients_finite
        assert scale is not None and finite is not None
        opt = self.optimizer
        unscaled = opt._checked(grads_and_vars, global_step)
        graph = scale.graph
        # Gradients changed after compute_gradients (clipped, say) are checked too: an inf clipped is a NaN.
        computed = {(id(t.node), t.index) for t in self._unscaled}
        changed = [g for g, _ in unscaled if (id(g.node), g.index) not in computed]
        if changed:
            finite = logical_and(finite, _all_finite(changed), name="all_finite")
        lrs, slots_of = opt._rates_and_slots(graph, unscaled, global_step)
        # What a skipped step puts back: every variable and slot as it was before the update. The copy and the
        # put-back read the variable in place after its update, so they run where it lives (placement follows
        # colocation): on another device they would read a copy sent before the update.
        kept = []
        for t in [v for _, v in unscaled] + [s for slots in slots_of for s in slots.values()]:
            with graph.colocate_with(t):
                kept.append((t, mul(t, 1.0, name="before_step")))
        updates = opt._updates(unscaled, lrs, slots_of, after=[t for _, t in kept])
        restores = []
        with graph.control_dependencies(updates):
            for t, before in kept:
                with graph.colocate_with(t):
                    restores.append(assign(t, where(finite, t, before), name="keep_if_finite"))
        _, good, steps = self._scale_variables(graph)
        with graph.control_dependencies(restores):
            rescale = apply(
                "UpdateLossScale", [scale, good, steps, finite], {"growth_interval": self.growth_interval},
                name="update_loss_scale",
            )  # fmt: skip
        if global_step is not None:
            with graph.control_dependencies([rescale]):
                return group(assign_add(global_step, 1), name="update")
        return group(rescale, name="update")


def _all_finite(grads: Sequence[Tensor]) -> Tensor:
    """One bool scalar: every element of every tensor of ``grads`` is finite."""
    finite = reduce_all(is_finite(grads[0]))
    for g in grads[1:]:
        finite = logical_and(finite, reduce_all(is_finite(g)), name="all_finite")
    return finite


def mixed_precision(
    optimizer: Optimizer,
    initial_scale: float = 2.0**15,
    growth_interval: int = 2000,
    compute_dtype: str = "float16",
) -> MixedPrecision:
    """Train with ``optimizer`` on float32 master weights, computing in ``compute_dtype`` under a dynamic loss scale.

    Read each variable (and the input) in the forward pass through ``mp.cast``;
    cast the logits back to float32 before the loss. A step with an inf or NaN
    gradient is skipped, the scale halved and a ``LossScaleWarning`` issued;
    ``growth_interval`` finite steps in a row double it.

    Examples
    --------
    >>> import cellgraph as cg
    >>> cg.optim.mixed_precision(cg.optim.Adam(1e-3))
    mixed_precision(Adam(learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-08), initial_scale=32768, growth_interval=2000, compute_dtype='float16')
    """  # noqa: E501 - a doctest's output is one line
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"mixed_precision wraps a cg.optim optimizer, got {type(optimizer).__name__}")
    if not (isinstance(initial_scale, (int, float)) and math.isfinite(initial_scale) and initial_scale > 0):
        raise ValueError(f"mixed_precision: initial_scale must be a finite number more than 0, got {initial_scale!r}")
    if initial_scale > _MAX_SCALE:  # it is kept in float32, where it would be inf
        raise ValueError(
            f"mixed_precision: initial_scale {initial_scale:g} does not fit the float32 loss scale "
            f"(at most {_MAX_SCALE:g}); 2**15, the default, is where float16 training usually starts"
        )
    if isinstance(growth_interval, bool) or not isinstance(growth_interval, int) or growth_interval < 1:
        raise ValueError(f"mixed_precision: growth_interval must be an int of at least 1, got {growth_interval!r}")
    dtype = as_dtype(compute_dtype)
    if dtype not in HALF_FLOATS:
        raise DTypeError(f"mixed_precision: compute_dtype must be float16 or bfloat16, got {dtype}")
    return MixedPrecision(optimizer, float(initial_scale), growth_interval, dtype)


__all__ = ["LossScaleWarning", "MixedPrecision", "mixed_precision"]
