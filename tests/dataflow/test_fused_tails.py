"""A fused loop agrees with the op-by-op kernels over the whole range, tails included.

Every fusable unary op (the registry's ops with an elementwise expression of
one operand) runs fused with a following Neg and op by op, on the CPU and on
the CUDA column, at values where cancellations, overflows and special values
live: 0, ±1, ±10, ±17, ±20, ±40, ±80, ±88, ±100, ±1e4, subnormals, ±inf, NaN.
Both must match the NumPy reference.
"""

from __future__ import annotations

import numpy as np
import pytest

import cellgraph as cg
from cellgraph.dataflow.executor import Plan
from cellgraph.dataflow.opdef import OPS
from cellgraph.dataflow.ops.base import apply
from cellgraph.dataflow.variables import VariableStore

UNARY = sorted(
    name for name in OPS if (e := OPS.lookup(name).elementwise) is not None and "{0}" in e and "{1}" not in e
)
DTYPES = ["float32", "float64"]
# Ops whose expression reads attrs: the attrs they run with here.
ATTRS = {"LeakyRelu": {"alpha": 0.2}, "Elu": {"alpha": 1.0}}
# Within a few ulp of the reference: the op table's float tolerances.
RTOL = {"float32": 2e-6, "float64": 1e-12}


def _special_values(dtype: str) -> np.ndarray:
    tiny = np.finfo(dtype).smallest_subnormal
    magnitudes = [0.0, 1.0, 10.0, 17.0, 20.0, 40.0, 80.0, 88.0, 100.0, 1e4, np.inf, float(tiny), float(tiny) * 1000]
    values = [v for m in magnitudes for v in (m, -m)] + [np.nan]
    return np.array(values, dtype)


def _plans(op: str, dtype: str, device: str) -> tuple[Plan, Plan]:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None,), dtype, name="x")
        out = cg.neg(apply(op, [x], ATTRS.get(op, {}), name="op"))
    return tuple(  # type: ignore[return-value]
        Plan(g, [out], [], [x], VariableStore(), device=device, fuse=fuse) for fuse in (True, False)
    )


def _reference(op: str, x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return -OPS.lookup(op).reference(ATTRS.get(op, {}), x.copy()).astype(x.dtype)


def _check(op: str, dtype: str, fused: np.ndarray, unfused: np.ndarray, x: np.ndarray) -> None:
    want = _reference(op, x)
    atol = float(np.finfo(dtype).smallest_subnormal) * 4
    for label, got in (("fused", fused), ("op by op", unfused)):
        assert got.dtype == np.dtype(dtype)
        np.testing.assert_allclose(got, want, rtol=RTOL[dtype], atol=atol, equal_nan=True, err_msg=f"{op} {label}")
    np.testing.assert_allclose(fused, unfused, rtol=RTOL[dtype], atol=atol, equal_nan=True, err_msg=op)


def test_the_fusable_unary_ops_are_the_ones_expected() -> None:
    # A new fusable op joins this test by itself; this guards against the
    # discovery finding none.
    assert {"Exp", "Log", "Neg", "Relu", "Sigmoid", "Sqrt", "Square", "Tanh"} <= set(UNARY)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", UNARY)
def test_fused_cpu_loops_keep_the_tails(op: str, dtype: str) -> None:
    fused, plain = _plans(op, dtype, "cpu")
    assert max(len(step.nodes) for step in fused.steps) == 2, "the op and the Neg after it must fuse"
    x = _special_values(dtype)
    with np.errstate(all="ignore"):
        (got,) = fused(x)
        (unfused,) = plain(x)
    _check(op, dtype, got, unfused, x)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", UNARY)
def test_fused_cuda_kernels_keep_the_tails(op: str, dtype: str) -> None:
    from numba import cuda

    fused, plain = _plans(op, dtype, "cuda")
    assert max(len(step.nodes) for step in fused.steps) == 2, "the op and the Neg after it must fuse"
    x = _special_values(dtype)
    with np.errstate(all="ignore"):
        (got,) = fused(cuda.to_device(x))
        (unfused,) = plain(cuda.to_device(x))
    _check(op, dtype, got.copy_to_host(), unfused.copy_to_host(), x)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])
def test_log_of_sigmoid_keeps_its_tail(dtype: str, fuse: bool) -> None:
    # The reproduction: log(sigmoid(x)) is x - log1p(exp(x)), about x far left.
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None,), dtype, name="x")
        y = cg.log(cg.sigmoid(x))
    xs = np.array([-10.0, -20.0, -40.0, -80.0], dtype)
    got = cg.Session(g, fuse=fuse).run(y, {x: xs})
    want = xs.astype(np.float64) - np.log1p(np.exp(xs.astype(np.float64)))
    np.testing.assert_allclose(got, want, rtol=RTOL[dtype])
