"""Ops on the narrow dtypes, one row per op and dtype.

A half-float row is checked against NumPy computing in float32 on the upcast
inputs, then rounding to the half dtype: what the storage-only rule promises.
An int row is checked against NumPy computing in the int dtype itself (sums
and products wrap, as TensorFlow's do). Accumulation in float32 is shown where
half accumulation would visibly fail: float16 stops counting at 2048 and
bfloat16 at 256.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import cellgraph as cg
from cellgraph.dataflow.dtypes import DTYPES

HALVES = ["float16", "bfloat16"]
SMALL_INTS = ["int8", "uint8", "int16"]

Build = Callable[[cg.Tensor, cg.Tensor], cg.Tensor]
Ref = Callable[[np.ndarray, np.ndarray], Any]

# name, cellgraph build, NumPy reference (same for both kinds: the inputs say the precision)
BINARY: list[tuple[str, Build, Ref]] = [
    ("add",           lambda a, b: a + b,                np.add),
    ("sub",           lambda a, b: a - b,                np.subtract),
    ("mul",           lambda a, b: a * b,                np.multiply),
    ("maximum",       cg.maximum,                        np.maximum),
    ("minimum",       cg.minimum,                        np.minimum),
    ("less",          lambda a, b: a < b,                np.less),
    ("less_equal",    lambda a, b: a <= b,               np.less_equal),
    ("greater",       lambda a, b: a > b,                np.greater),
    ("greater_equal", lambda a, b: a >= b,               np.greater_equal),
    ("equal",         cg.equal,                          np.equal),
    ("not_equal",     cg.not_equal,                      np.not_equal),
    ("floordiv",      lambda a, b: a // b,               np.floor_divide),
    ("mod",           lambda a, b: a % b,                np.mod),
    ("neg",           lambda a, b: -a,                   lambda a, b: -a),
    ("abs",           lambda a, b: abs(a),               lambda a, b: np.abs(a)),
    ("square",        lambda a, b: cg.square(a),         lambda a, b: a * a),
    ("where",         lambda a, b: cg.where(a < b, a, b), lambda a, b: np.where(a < b, a, b)),
    ("reduce_sum",    lambda a, b: cg.reduce_sum(a, axis=1),  lambda a, b: np.sum(a, axis=1, dtype=a.dtype)),
    ("reduce_prod",   lambda a, b: cg.reduce_prod(a, axis=0), lambda a, b: np.prod(a, axis=0, dtype=a.dtype)),
    ("reduce_max",    lambda a, b: cg.reduce_max(a, axis=1),  lambda a, b: np.max(a, axis=1)),
    ("reduce_min",    lambda a, b: cg.reduce_min(a),          lambda a, b: np.min(a)),
    ("argmax",        lambda a, b: cg.argmax(a, axis=1),      lambda a, b: np.argmax(a, axis=1).astype(np.int32)),
    ("matmul",        lambda a, b: cg.matmul(a, cg.transpose(b)), lambda a, b: a @ b.T),
]  # fmt: skip
# Ops only floats take: checked for the half floats alone.
FLOAT_ONLY: list[tuple[str, Build, Ref]] = [
    ("div",         lambda a, b: a / b,                     np.divide),
    ("exp",         lambda a, b: cg.exp(a),                 lambda a, b: np.exp(a)),
    ("sqrt",        lambda a, b: cg.sqrt(abs(a)),           lambda a, b: np.sqrt(np.abs(a))),
    ("reduce_mean", lambda a, b: cg.reduce_mean(a, axis=1), lambda a, b: np.mean(a, axis=1)),
    ("relu",        lambda a, b: cg.relu(a),                lambda a, b: np.maximum(a, 0)),
    ("softmax",     lambda a, b: cg.softmax(a),             lambda a, b: np.exp(a) / np.exp(a).sum(-1, keepdims=True)),
]  # fmt: skip


def _data(dtype: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype in HALVES:
        return rng.uniform(-4, 4, (3, 5)).astype(DTYPES[dtype])
    low = 0 if dtype == "uint8" else -12
    values = rng.integers(low, 13, (3, 5))
    return np.where(values == 0, 3, values).astype(DTYPES[dtype])  # no zero divisors for // and %


def _run(build: Build, dtype: str, a: np.ndarray, b: np.ndarray) -> tuple[cg.Tensor, np.ndarray]:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder(a.shape, dtype, name="a")
        y = cg.placeholder(b.shape, dtype, name="b")
        out = build(x, y)
    return out, cg.Session(g).run(out, {x: a, y: b})


def _check_half(build: Build, ref: Ref, dtype: str) -> None:
    a, b = _data(dtype, 1), _data(dtype, 2)
    out, got = _run(build, dtype, a, b)
    want = np.asarray(ref(a.astype(np.float32), b.astype(np.float32)))
    assert got.dtype == DTYPES[out.dtype]
    if want.dtype == np.float32:
        assert out.dtype == dtype
        # Computed in float32 and rounded once: equal to NumPy's float32 result rounded, within
        # one ulp of the half type where float32 summation order or libm may differ in the last bit.
        eps = float(ml_dtypes.finfo(DTYPES[dtype]).eps)
        np.testing.assert_allclose(got.astype(np.float32), want.astype(DTYPES[dtype]).astype(np.float32),
                                   rtol=eps, atol=eps)  # fmt: skip
    else:
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize(("name", "build", "ref"), BINARY + FLOAT_ONLY, ids=[r[0] for r in BINARY + FLOAT_ONLY])
def test_half_float_ops_compute_in_float32_and_round(name: str, build: Build, ref: Ref, dtype: str) -> None:
    _check_half(build, ref, dtype)


@pytest.mark.parametrize("dtype", SMALL_INTS)
@pytest.mark.parametrize(("name", "build", "ref"), BINARY, ids=[r[0] for r in BINARY])
def test_small_int_ops_compute_in_their_own_dtype(name: str, build: Build, ref: Ref, dtype: str) -> None:
    a, b = _data(dtype, 1), _data(dtype, 2)
    out, got = _run(build, dtype, a, b)
    with np.errstate(over="ignore"):
        want = np.asarray(ref(a, b))
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", SMALL_INTS)
def test_small_int_arithmetic_wraps(dtype: str) -> None:
    info = np.iinfo(DTYPES[dtype])
    a = np.array([info.max, info.min], DTYPES[dtype])
    _, got = _run(lambda x, y: x + y, dtype, a, np.ones(2, DTYPES[dtype]))
    assert got.tolist() == [info.min, info.min + 1]
    _, total = _run(lambda x, y: cg.reduce_sum(x), dtype, np.full(4, info.max, DTYPES[dtype]), a)
    assert total == np.sum(np.full(4, info.max, DTYPES[dtype]), dtype=DTYPES[dtype])


@pytest.mark.parametrize(("dtype", "n"), [("float16", 4096), ("bfloat16", 1000)])
def test_half_sums_and_matmuls_accumulate_in_float32(dtype: str, n: int) -> None:
    # In its own precision float16 stops at 2048 (2048 + 1 rounds back to 2048), bfloat16 at 256;
    # n is exactly representable in the half type, so the float32 total comes back exact.
    ones = np.ones((1, n), DTYPES[dtype])
    _, total = _run(lambda x, y: cg.reduce_sum(x), dtype, ones, ones)
    _, product = _run(lambda x, y: cg.matmul(x, cg.transpose(y)), dtype, ones, ones)
    assert total.dtype == product.dtype == DTYPES[dtype]
    assert float(total) == float(product[0, 0]) == n


def test_half_matmul_matches_numpy_in_float32_rounded_on_a_larger_product() -> None:
    rng = np.random.default_rng(3)
    for dtype in HALVES:
        a = rng.standard_normal((17, 300)).astype(DTYPES[dtype])
        b = rng.standard_normal((300, 9)).astype(DTYPES[dtype])
        _, got = _run(lambda x, y: cg.matmul(x, y), dtype, a, b)
        want = (a.astype(np.float32) @ b.astype(np.float32)).astype(DTYPES[dtype])
        eps = float(ml_dtypes.finfo(DTYPES[dtype]).eps)
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=eps, atol=eps)


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16"])
def test_gather_takes_small_int_indices(dtype: str) -> None:
    params = np.arange(12, dtype=np.float32).reshape(4, 3)
    g = cg.Graph()
    with g.as_default():
        p = cg.placeholder((4, 3), "float32", name="p")
        i = cg.placeholder((2,), dtype, name="i")
        out = cg.gather(p, i)
    got = cg.Session(g).run(out, {p: params, i: np.array([3, 1], DTYPES[dtype])})
    np.testing.assert_array_equal(got, params[[3, 1]])


def test_python_int_operand_fits_a_uint8_tensor() -> None:
    _, got = _run(
        lambda x, y: cg.clip_by_value(x + 1, 2, 5), "uint8", np.array([0, 3, 9], np.uint8), np.zeros(3, np.uint8)
    )
    assert got.dtype == np.uint8 and got.tolist() == [2, 4, 5]


def test_a_big_endian_constant_computes_with_its_values() -> None:
    """A ``>f4`` array (from a file written elsewhere) as a constant: before, the first kernel that read it
    failed in Numba ("Unsupported array dtype: >f4")."""
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 2), "float32", name="x")
        c = cg.constant(np.array([[1.0, 2.0], [3.0, 4.0]], ">f4"))
        y = cg.matmul(x, c) + c
    out = cg.Session(g).run(y, {x: np.ones((2, 2), np.float32)})
    np.testing.assert_array_equal(out, [[5.0, 8.0], [7.0, 10.0]])
    assert c.dtype == "float32"


@pytest.mark.parametrize(
    ("value", "dtype", "words"),
    [
        (np.array([2**40]), "int32", "constant 'c' as int32: it holds 1099511627776, outside int32's range"),
        (300, "uint8", "constant 'c' as uint8: it holds 300, outside uint8's range [0, 255]"),
        ([1.5, 2.0], "int32", "constant 'c' as int32: it holds values that are not whole numbers"),
    ],
)
def test_a_constant_whose_numbers_would_change_is_refused(value: Any, dtype: str, words: str) -> None:
    """Before, cg.constant cast with NumPy: 2**40 became 0 and 1.5 became 1, without a word."""
    g = cg.Graph()
    with g.as_default(), pytest.raises(cg.DTypeError) as refused:
        cg.constant(value, dtype, name="c")
    assert words in str(refused.value)
    assert len(g) == 0  # nothing was added
    with g.as_default():
        assert cg.Session(g).run(cg.constant([1.0, 2.0], "int32")).tolist() == [1, 2]  # whole numbers are fine


def test_an_int_feed_that_does_not_fit_its_placeholder_is_refused() -> None:
    g = cg.Graph()
    with g.as_default():
        i = cg.placeholder((None,), "int32", name="i")
        total = cg.reduce_sum(i)
    session = cg.Session(g)
    assert session.run(total, {i: np.array([1, 2, 3])}) == 6  # int64 that fits: cast as before
    with pytest.raises(cg.DTypeError) as refused:
        session.run(total, {i: np.array([1, -(2**31) - 1])})
    assert str(refused.value) == (
        f"feed for 'i:0' ({i.node.where()}) (int64) does not fit int32: it holds -2147483649, outside int32's range "
        "[-2147483648, 2147483647]"
    )
