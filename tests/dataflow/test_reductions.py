"""ops/reductions.py: errors in the words a user reads, the keepdims and output_type
variants of argmax and argmin, stability of logsumexp, moments, and empty sets."""

from __future__ import annotations

import numpy as np
import pytest

import cellgraph as cg

from .errors_helpers import ph, raises

pytestmark = pytest.mark.usefixtures("fresh_graph")


def _run(fetches, feeds=None):  # noqa: ANN001, ANN202
    return cg.Session(cg.get_default_graph()).run(fetches, feeds or {})


# ------------------------------------------------------------------ errors
@pytest.mark.parametrize(
    ("build", "op", "words"),
    [
        (lambda x: cg.reduce_min(x, axis=2), "ReduceMin", "axis 2 is out of range for shape (3, 4)"),
        (lambda x: cg.reduce_prod(x, axis=(0, -3)), "ReduceProd", "axis (0, -3) is out of range for shape (3, 4)"),
        (lambda x: cg.reduce_logsumexp(x, axis=5), "ReduceLogSumExp", "axis 5 is out of range for shape (3, 4)"),
        (lambda x: cg.reduce_any(x > 0, axis=-3), "ReduceAny", "axis -3 is out of range for shape (3, 4)"),
        (lambda x: cg.argmin(x, axis=2), "ArgMin", "axis 2 is out of range for shape (3, 4)"),
        (lambda x: cg.argmax(x, axis=-3, keepdims=True), "ArgMax", "axis -3 is out of range for shape (3, 4)"),
    ],
)
def test_a_bad_axis_names_the_op_the_axis_and_the_shape(build, op, words) -> None:  # noqa: ANN001
    with raises(cg.ShapeError, words) as caught:
        build(ph(3, 4))
    assert str(caught.value).startswith(f"{op} ")


@pytest.mark.parametrize(
    ("build", "op", "words"),
    [
        (lambda f, i, b: cg.reduce_any(f), "ReduceAny", "expects a bool tensor, got float32"),
        (lambda f, i, b: cg.reduce_all(i), "ReduceAll", "expects a bool tensor, got int32"),
        (lambda f, i, b: cg.reduce_logsumexp(i), "ReduceLogSumExp", "expects a float tensor, got int32"),
        (lambda f, i, b: cg.reduce_prod(b), "ReduceProd", "expects a float or int tensor, got bool"),
        (lambda f, i, b: cg.argmin(b), "ArgMin", "expects a float or int tensor, got bool"),
    ],
)
def test_a_wrong_dtype_names_the_op_and_the_dtype(build, op, words) -> None:  # noqa: ANN001
    f, i, b = ph(3), ph(3, dtype="int32", name="i"), ph(3, dtype="bool", name="b")
    with raises(cg.DTypeError, words) as caught:
        build(f, i, b)
    assert str(caught.value).startswith(f"{op} ")


def test_argmin_refuses_an_output_type_it_cannot_give_and_leaves_the_graph_as_it_was() -> None:
    x = ph(3, 4)
    before = len(cg.get_default_graph().nodes)
    with raises(ValueError, "argmin: output_type must be 'int32' or 'int64', got 'float32'"):
        cg.argmin(x, output_type="float32")
    with raises(TypeError, "argmax: axis must be one int, got (0, 1)"):
        cg.argmax(x, axis=(0, 1))  # type: ignore[arg-type]
    assert len(cg.get_default_graph().nodes) == before


def test_moments_of_an_int_tensor_says_so() -> None:
    with raises(cg.DTypeError, "moments: expects a float tensor, got int32"):
        cg.moments(ph(3, dtype="int32"), axes=0)


def test_argmin_over_an_empty_axis_fails_the_run_naming_the_node() -> None:
    x = ph(None, 3)
    out = cg.argmin(x, axis=0, name="pick")
    with pytest.raises(cg.ExecutionError, match=r"pick.*argmin over an empty axis: axis 0 of \(0, 3\)"):
        _run(out, {x: np.zeros((0, 3), np.float32)})


# --------------------------------------------------------------- semantics
def test_argmax_and_argmin_keepdims_and_int64() -> None:
    data = np.array([[[3.0, 1.0], [0.0, 5.0], [2.0, 2.0]]], np.float32)  # (1, 3, 2)
    x = ph(1, 3, 2)
    top = cg.argmax(x, axis=1, keepdims=True, output_type="int64")
    low = cg.argmin(x, axis=-1, keepdims=True)
    plain = cg.argmin(x, axis=1)
    assert top.shape == (1, 1, 2) and top.dtype == "int64"
    assert low.shape == (1, 3, 1) and low.dtype == "int32"
    got_top, got_low, got_plain = _run([top, low, plain], {x: data})
    np.testing.assert_array_equal(got_top, np.argmax(data, axis=1, keepdims=True))
    assert got_top.dtype == np.int64
    np.testing.assert_array_equal(got_low, np.argmin(data, axis=-1, keepdims=True))
    np.testing.assert_array_equal(got_plain, [[1, 0]])


def test_logsumexp_does_not_overflow_and_keeps_infinities() -> None:
    data = np.array([[88.0, 89.0, 90.0], [-np.inf, -np.inf, -np.inf], [np.inf, 0.0, 1.0]], np.float32)
    x = ph(3, 3)
    got = _run(cg.reduce_logsumexp(x, axis=1), {x: data})
    want = np.array([90.0 + np.log1p(np.exp(-1.0) + np.exp(-2.0)), -np.inf, np.inf], np.float32)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert got.dtype == np.float32


def test_the_identities_over_an_empty_set() -> None:
    x, b = ph(None, 2), ph(None, 2, dtype="bool", name="b")
    fetches = [cg.reduce_min(x, 0), cg.reduce_prod(x, 0), cg.reduce_logsumexp(x, 0), cg.reduce_any(b, 0),
               cg.reduce_all(b, 0)]  # fmt: skip
    got = _run(fetches, {x: np.zeros((0, 2), np.float32), b: np.zeros((0, 2), bool)})
    for value, want in zip(got, [np.inf, 1.0, -np.inf, False, True]):
        np.testing.assert_array_equal(value, [want, want])


def test_moments_match_numpy_and_keepdims() -> None:
    data = np.random.default_rng(3).normal(2.0, 3.0, (4, 5, 6)).astype(np.float32)
    x = ph(None, 5, 6)
    mean, variance = cg.moments(x, axes=(0, 1))
    mean_k, variance_k = cg.moments(x, axes=(0, 1), keepdims=True)
    assert mean.shape == variance.shape == (6,)
    assert mean_k.shape == variance_k.shape == (1, 1, 6)
    got = _run([mean, variance, mean_k, variance_k], {x: data})
    np.testing.assert_allclose(got[0], data.mean((0, 1)), rtol=1e-5)
    np.testing.assert_allclose(got[1], data.var((0, 1)), rtol=1e-4)
    np.testing.assert_allclose(got[2], data.mean((0, 1), keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(got[3], data.var((0, 1), keepdims=True), rtol=1e-4)


def test_the_gradient_of_prod_at_zeros_is_the_product_of_the_others() -> None:
    data = np.array([[2.0, 3.0, 4.0], [0.0, 3.0, 4.0], [0.0, 0.0, 4.0]], np.float32)
    x = ph(3, 3)
    (grad,) = cg.gradients(cg.reduce_sum(cg.reduce_prod(x, axis=1)), [x])
    want = [[12.0, 8.0, 6.0], [12.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    np.testing.assert_array_equal(_run(grad, {x: data}), want)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_last_axis_sum_of_any_length_is_the_float64_sum(dtype: str) -> None:
    # The last axis has its own kernel (eight accumulators, blocks of 1024): lengths around both edges.
    from cellgraph.dataflow.kernels.cpu.reduce import reducer

    rng = np.random.default_rng(0)
    for length in (1, 7, 8, 9, 1023, 1024, 1025, 3001):
        x = (rng.standard_normal((3, length)) * 1e3).astype(dtype)
        want = x.astype(np.float64).sum(axis=1)
        got = reducer("sum", (1,), False)(x)
        assert got.dtype == np.dtype(dtype)
        np.testing.assert_allclose(got, want.astype(dtype), rtol=1e-6 if dtype == "float32" else 1e-13)
        np.testing.assert_allclose(reducer("mean", (1,), True)(x)[:, 0], (want / length).astype(dtype), rtol=1e-6)
