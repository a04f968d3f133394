"""ops/batch_matmul.py: which node ``matmul`` builds, its errors in the words a user
reads (both shapes named), int operands, and the gradient summed over broadcast batches."""

from __future__ import annotations

import numpy as np
import pytest

import cellgraph as cg
from cellgraph.dataflow.ops.batch_matmul import batch_matmul

from .errors_helpers import ph, raises

pytestmark = pytest.mark.usefixtures("fresh_graph")


def test_matmul_builds_matmul_for_matrices_and_batch_matmul_above() -> None:
    assert cg.matmul(ph(2, 3), ph(3, 4, name="y")).node.op == "MatMul"
    out = ph(5, 2, 3) @ ph(3, 4, name="y")
    assert out.node.op == "BatchMatMul" and out.shape == (5, 2, 4)


@pytest.mark.parametrize(
    ("a", "b", "kw", "words"),
    [
        ((2, 3, 4), (2, 5, 6), {}, "BatchMatMul 'matmul'"),
        ((2, 3, 4), (2, 5, 6), {}, "inner dimensions differ: 4 and 5 in (2, 3, 4) @ (2, 5, 6)"),
        ((2, 3, 4), (2, 6, 5), {"transpose_b": True},
         "inner dimensions differ: 4 and 5 in (2, 3, 4) @ (2, 6, 5), transpose_b=True"),
        ((2, 4, 3), (2, 6, 5), {"transpose_a": True, "transpose_b": True},
         "inner dimensions differ: 4 and 5 in (2, 4, 3) @ (2, 6, 5), transpose_a=True, transpose_b=True"),
        ((2, 3, 4), (5, 4, 6), {}, "batch dimensions do not broadcast: (2,) and (5,) in (2, 3, 4) @ (5, 4, 6)"),
        ((7, 2, 3, 4), (5, 4, 6), {}, "batch dimensions do not broadcast: (7, 2) and (5,) in (7, 2, 3, 4) @ (5, 4, 6)"),
        ((2, 3, 4), (4,), {},
         "expects operands of rank 2 or more (batches of matrices), got ranks 3 and 1: (2, 3, 4) @ (4,)"),
    ],
)  # fmt: skip
def test_shape_errors_name_both_shapes(a, b, kw, words) -> None:  # noqa: ANN001
    before = len(cg.get_default_graph().nodes)
    x, y = ph(*a), ph(*b, name="y")
    with raises(cg.ShapeError, words):
        cg.matmul(x, y, **kw)
    assert len(cg.get_default_graph().nodes) == before + 2  # the two placeholders, nothing else


def test_a_dtype_mismatch_names_both_dtypes() -> None:
    pattern = r"^BatchMatMul 'bmm' \(.*\): operands have different dtypes: float32 and float64$"
    with pytest.raises(cg.DTypeError, match=pattern):
        batch_matmul(ph(2, 2, 2), ph(2, 2, 2, dtype="float64", name="y"), name="bmm")


def test_unknown_batch_and_inner_dims_infer_what_is_known() -> None:
    out = cg.matmul(ph(None, 1, 3, None), ph(4, None, 5, name="y"))
    assert out.shape == (None, 4, 3, 5)


def test_int_operands_multiply_exactly() -> None:
    a = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    b = np.arange(8, dtype=np.int32).reshape(4, 2) - 3
    x, y = ph(2, 3, 4, dtype="int32"), ph(4, 2, dtype="int32", name="y")
    got = cg.Session(cg.get_default_graph()).run(cg.matmul(x, y), {x: a, y: b})
    np.testing.assert_array_equal(got, a @ b)
    assert got.dtype == np.int32


def test_the_gradient_of_a_broadcast_operand_is_summed_over_the_batch() -> None:
    rng = np.random.default_rng(4)
    a, w = rng.standard_normal((5, 3, 4)), rng.standard_normal((1, 4, 2))
    x, y = ph(5, 3, 4, dtype="float64"), ph(1, 4, 2, dtype="float64", name="y")
    gx, gy = cg.gradients(cg.reduce_sum(x @ y), [x, y])
    got_x, got_y = cg.Session(cg.get_default_graph()).run([gx, gy], {x: a, y: w})
    assert got_y.shape == (1, 4, 2)
    np.testing.assert_allclose(got_y, a.sum(axis=(0, 1))[None, :, None].repeat(2, axis=2))
    np.testing.assert_allclose(got_x, np.broadcast_to(w.sum(axis=2)[:, None, :], (5, 3, 4)))
