"""The op families. Importing this package registers every op."""

from __future__ import annotations

from . import (
    activations,
    array,
    array_gather,
    array_index,
    array_more,
    array_shape,
    array_slice,
    batch_matmul,
    conv,
    conv_more,
    cumulative,
    einsum,
    logic,
    math,
    math_unary,
    nn,
    normalization,
    placeholder_default,
    reductions,
    resize,
    schedule,
    state,
    top_k,
    training,
    transfer,
)
from .base import atomic_op

FAMILIES = (
    state, math, batch_matmul, math_unary, reductions, logic, nn, normalization, activations, conv, conv_more, array,
    array_gather, array_slice,
    training, transfer, array_more, placeholder_default, schedule, array_index, array_shape,
    einsum, cumulative, top_k, resize,
)  # fmt: skip

# Every public op function is all-or-nothing: a rejected op leaves no stray
# constants behind. Replacing the module attribute also covers calls between
# ops inside a family (gradient rules call the public functions).
for _family in FAMILIES:
    for _name in _family.__all__:
        setattr(_family, _name, atomic_op(getattr(_family, _name)))

# Imported once the op functions are wrapped: its table holds the wrapped ones.
from . import operators  # noqa: E402

operators.install()
