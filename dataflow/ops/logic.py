"""Logic ops: the comparisons math.py lacks, the logical connectives, NaN and finiteness tests.

None is differentiable: a bool has no gradient. ``&``, ``|``, ``^`` and ``~``
on tensors are these connectives, on bool tensors only (cellgraph has no
bitwise integer ops), as PyTorch's and NumPy's are on bool arrays.

Examples
--------
>>> import numpy as np
>>> import cellgraph as cg
>>> g = cg.Graph()
>>> with g.as_default():
...     x = cg.placeholder((3,), name="x")
...     bad = cg.logical_not(cg.is_finite(x))
>>> cg.Session(g).run(bad, {x: np.array([1.0, np.nan, np.inf], np.float32)})
array([False,  True,  True])
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..dtypes import FLOATS
from ..graph import Tensor
from ..kernels.cpu import math_more as mk
from ..kernels.cuda import cuda_kernel
from ..opdef import InferContext, OpDef, TensorSpec, not_differentiable, register_op
from .base import TensorLike, apply, binary_inputs, elementwise_kernel, infer_broadcast, infer_compare

FAMILY = "logic"
NOT_BITWISE = "&, |, ^ and ~ are logical operators on bool tensors; cellgraph has no bitwise integer ops"


def _infer_logical(ctx: InferContext) -> TensorSpec:
    a, b = ctx.inputs
    if a.dtype != "bool" or b.dtype != "bool":
        raise ctx.dtype_error(f"expects bool tensors, got {a.dtype} and {b.dtype} ({NOT_BITWISE})")
    return infer_broadcast(ctx)


def _infer_logical_not(ctx: InferContext) -> TensorSpec:
    x = ctx.inputs[0]
    if x.dtype != "bool":
        raise ctx.dtype_error(f"expects a bool tensor, got {x.dtype} ({NOT_BITWISE})")
    return x


def _infer_float_test(ctx: InferContext) -> TensorSpec:
    x = ctx.inputs[0]
    if x.dtype not in FLOATS:
        raise ctx.dtype_error(f"expects a float tensor, got {x.dtype}")
    return TensorSpec(x.shape, "bool")


# name, kernel, reference, shape rule
_BINARY: list[tuple[Any, ...]] = [
    ("NotEqual",   mk.not_equal,   np.not_equal,   infer_compare),
    ("LogicalAnd", mk.logical_and, np.logical_and, _infer_logical),
    ("LogicalOr",  mk.logical_or,  np.logical_or,  _infer_logical),
    ("LogicalXor", mk.logical_xor, np.logical_xor, _infer_logical),
]  # fmt: skip
_UNARY: list[tuple[Any, ...]] = [
    ("LogicalNot", mk.logical_not, np.logical_not, _infer_logical_not),
    ("IsNan",      mk.is_nan,      np.isnan,       _infer_float_test),
    ("IsFinite",   mk.is_finite,   np.isfinite,    _infer_float_test),
]  # fmt: skip

for _name, _kernel, _ref, _infer in _BINARY:
    register_op(OpDef(
        name=_name, family=FAMILY, infer=_infer, reference=lambda attrs, a, b, _f=_ref: _f(a, b),
        grad=not_differentiable, broadcasts=True, strings=_name == "NotEqual",
        kernels={"cpu": elementwise_kernel(_kernel), "cuda": cuda_kernel("elementwise", "binary_op", _name)},
    ))  # fmt: skip
for _name, _kernel, _ref, _infer in _UNARY:
    register_op(OpDef(
        name=_name, family=FAMILY, infer=_infer, reference=lambda attrs, x, _f=_ref: np.asarray(_f(x)),
        grad=not_differentiable,
        kernels={"cpu": elementwise_kernel(_kernel), "cuda": cuda_kernel("elementwise", "unary_attr_op", _name)},
    ))  # fmt: skip


def greater(a: TensorLike, b: TensorLike, name: str = "greater") -> Tensor:
    """Elementwise ``a > b`` as a bool tensor: a Less node with its operands swapped."""
    a, b = binary_inputs(a, b, "Less")
    return apply("Less", [b, a], name=name)


def not_equal(a: TensorLike, b: TensorLike, name: str = "not_equal") -> Tensor:
    """Elementwise ``a != b`` as a bool tensor (NaN differs from everything, itself included)."""
    return apply("NotEqual", binary_inputs(a, b, "NotEqual"), name=name)


def logical_and(a: TensorLike, b: TensorLike, name: str = "logical_and") -> Tensor:
    return apply("LogicalAnd", binary_inputs(a, b, "LogicalAnd"), name=name)


def logical_or(a: TensorLike, b: TensorLike, name: str = "logical_or") -> Tensor:
    return apply("LogicalOr", binary_inputs(a, b, "LogicalOr"), name=name)


def logical_xor(a: TensorLike, b: TensorLike, name: str = "logical_xor") -> Tensor:
    return apply("LogicalXor", binary_inputs(a, b, "LogicalXor"), name=name)


def logical_not(x: TensorLike, name: str = "logical_not") -> Tensor:
    return apply("LogicalNot", [x], name=name)


def is_nan(x: TensorLike, name: str = "is_nan") -> Tensor:
    return apply("IsNan", [x], name=name)


def is_finite(x: TensorLike, name: str = "is_finite") -> Tensor:
    """True where an element is neither infinite nor NaN."""
    return apply("IsFinite", [x], name=name)


__all__ = ["greater", "is_finite", "is_nan", "logical_and", "logical_not", "logical_or", "logical_xor", "not_equal"]
