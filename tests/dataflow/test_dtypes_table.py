"""The half-float column of the op table: every row with float32 inputs, run with them stored as float16 and
bfloat16, against the row's NumPy reference computed in float32 and rounded to the half type.

This is what "float16 and bfloat16 are storage dtypes" means op by op: each kernel reads half inputs as float32
(kernels/storage.py) and rounds its outputs once. The tolerance is a few half ulps, loosened where a row chains
many float32 operations (convolutions, normalisations) whose result is then rounded.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import cellgraph as cg

from .op_cases import OpCase
from .test_op_table import CASES, _build, _node_inputs, _outputs

# Ops whose rows cannot be stored in half precision, and why: the record docs/dtypes.md points to.
NOT_HALF = {
    "Assign": "writes a value into a variable of its own dtype (the row's variable is float32)",
    "AssignAdd": "writes a value into a variable of its own dtype (the row's variable is float32)",
    "NoOp": "the row groups an Assign",
    "ApplyGradientDescent": "optimizers update float32/float64 variables: cg.optim.mixed_precision keeps them so",
    "ApplyMomentum": "optimizers update float32/float64 variables: cg.optim.mixed_precision keeps them so",
    "ApplyAdam": "optimizers update float32/float64 variables: cg.optim.mixed_precision keeps them so",
    "ApplyAdamW": "optimizers update float32/float64 variables: cg.optim.mixed_precision keeps them so",
    "ApplyRMSProp": "optimizers update float32/float64 variables: cg.optim.mixed_precision keeps them so",
    "ApplyAdagrad": "optimizers update float32/float64 variables: cg.optim.mixed_precision keeps them so",
    "ApplyAdaMax": "optimizers update float32/float64 variables: cg.optim.mixed_precision keeps them so",
    "ApplyNadam": "optimizers update float32/float64 variables: cg.optim.mixed_precision keeps them so",
    "ApplyAdadelta": "optimizers update float32/float64 variables: cg.optim.mixed_precision keeps them so",
}
HALF_ROWS = [c for c in CASES if any(x.dtype == np.float32 for x in c.inputs) and c.op not in NOT_HALF]


def _rounded(want: np.ndarray, dtype: str) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.asarray(want).astype(dtype).astype(np.float64)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("case", HALF_ROWS, ids=[c.label for c in HALF_ROWS])
def test_every_op_stores_half_floats_and_computes_in_float32(case: OpCase, dtype: str) -> None:
    g, tensors, out, feeds, inputs = _build(case, {"float32": dtype})
    node = out if isinstance(out, cg.Node) else out.node
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # rows that probe inf and NaN
        got = cg.Session(g).run(node.outputs, feeds)
        stored = np.dtype(dtype)
        args = [np.asarray(x).astype(np.float32) if np.asarray(x).dtype == stored else x for x in
                _node_inputs(node, tensors, inputs)]  # fmt: skip
        want = _outputs(node.opdef.reference(node.attrs, *args))
    assert len(got) == len(want) == len(node.specs)
    for value, expected, spec in zip(got, want, node.specs):
        assert value.dtype == np.dtype(spec.dtype), f"{node.op}: kernel gave {value.dtype}, shape rule {spec.dtype}"
        if np.asarray(expected).dtype.kind == "f":
            # Rounded to what the node stores: the half type, or float32/float64 for a cast out of it.
            np.testing.assert_allclose(
                value.astype(np.float64), _rounded(expected, spec.dtype), rtol=2e-2, atol=2e-2, equal_nan=True
            )
        else:  # indices, bools, shapes: exact
            np.testing.assert_array_equal(value, expected)


def test_the_ops_that_do_not_store_half_floats_are_the_listed_ones() -> None:
    refused = set()
    for case in CASES:
        if case.op in NOT_HALF and any(x.dtype == np.float32 for x in case.inputs):
            try:
                _build(case, {"float32": "float16"})
            except cg.DTypeError:
                refused.add(case.op)
    assert refused == set(NOT_HALF)


def _fits(case: OpCase, dtype: str) -> bool:
    """Whether the row has int32 inputs and every one of their values fits ``dtype``."""
    ints = [x for x in case.inputs if x.dtype == np.int32]
    info = np.iinfo(dtype)
    return bool(ints) and all(not x.size or (x.min() >= info.min and x.max() <= info.max) for x in ints)


INT_ROWS = [(c, d) for d in ("int8", "uint8", "int16") for c in CASES if _fits(c, d)]


@pytest.mark.parametrize(("case", "dtype"), INT_ROWS, ids=[f"{c.label}-{d}" for c, d in INT_ROWS])
def test_every_op_with_int_inputs_takes_the_small_ints(case: OpCase, dtype: str) -> None:
    # The row's int32 inputs (data, indices, labels, shapes) as int8, uint8 or int16, where their values fit.
    g, tensors, out, feeds, inputs = _build(case, {"int32": dtype})
    node = out if isinstance(out, cg.Node) else out.node
    got = cg.Session(g).run(node.outputs, feeds)
    want = _outputs(node.opdef.reference(node.attrs, *_node_inputs(node, tensors, inputs)))
    for value, expected, spec in zip(got, want, node.specs):
        assert value.dtype == np.dtype(spec.dtype), f"{node.op}: kernel gave {value.dtype}, shape rule {spec.dtype}"
        # A reference may widen (np.sum of int8 is int64): the node keeps its dtype, wrapping as TensorFlow does.
        with np.errstate(over="ignore", invalid="ignore"):
            np.testing.assert_allclose(
                value.astype(np.float64),
                np.asarray(expected).astype(spec.dtype).astype(np.float64),
                rtol=case.rtol,
                atol=case.atol,
                equal_nan=True,
            )
