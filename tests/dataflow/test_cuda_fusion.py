"""Fused CUDA kernels give the same numbers as the CUDA kernels run one by one.

The ``cuda`` tests run on a GPU, or on Numba's simulator (small shapes: it is
slow); the slow test at the end runs them on the simulator in a subprocess.
"""

from __future__ import annotations

import numpy as np
import pytest

import cellgraph as cg
from cellgraph.dataflow.executor import Plan
from cellgraph.dataflow.fusion import find_segments
from cellgraph.dataflow.kernels.cuda.fusion import kernel_source, segment_kernel
from cellgraph.dataflow.variables import VariableStore


def _plans(out: cg.Tensor, feeds: list[cg.Tensor]) -> tuple[Plan, Plan]:
    """The fused and the unfused CUDA plan of ``out``."""
    return tuple(  # type: ignore[return-value]
        Plan(out.graph, [out], [], feeds, VariableStore(), device="cuda", fuse=fuse) for fuse in (True, False)
    )


def _run(plan: Plan, *values: np.ndarray) -> np.ndarray:
    from numba import cuda

    # np.array, not np.ascontiguousarray, which makes a scalar (1,): a plan checks its feeds' shapes now.
    (result,) = plan(*(cuda.to_device(np.array(v, np.float32, order="C")) for v in values))
    return result.copy_to_host()


def test_the_kernel_reads_one_value_inputs_once_per_thread() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((4,), name="x")
        s = cg.placeholder((), name="s")
        cg.square(x + s) / 2.0
    [segment] = find_segments([n for n in g.nodes if n.op not in ("Placeholder", "Const")], set())
    source = kernel_source(segment, scalars=[False, True, False])
    assert "@cuda.jit(cache=True)" in source and "def fused(n, out, x0, x1, x2):" in source
    assert "    v1 = x1[0]" in source  # once per thread
    # One thread an element, no loop: a grid-stride loop's trip count is a 64-bit division in every thread.
    assert "    i = cuda.grid(1)\n    if i < n:\n" in source and "gridsize" not in source and "range(" not in source
    assert "t0 = DT((x0[i] + v1))" in source and "t1 = DT((t0 * t0))" in source


@pytest.mark.cuda
def test_a_chain_with_one_value_and_full_inputs_fuses_to_one_kernel() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 5), name="x")
        y = cg.placeholder((None, 5), name="y")
        s = cg.placeholder((), name="s")
        h = cg.maximum(x * 2.0 - y, 0.0) * s + cg.exp(-cg.square(y))
        out = cg.sqrt(h * s + 1.5) / (y * y + 1.0) - cg.log(x * x + 1.0)
    fused, plain = _plans(out, [x, y, s])
    calls = [step for step in fused.steps if not step.constant]
    assert max(len(step.nodes) for step in calls) >= 5 and len(calls) < len(plain.steps)
    rng = np.random.default_rng(0)
    xv, yv = rng.normal(size=(3, 5)), rng.normal(size=(3, 5))
    got, want = _run(fused, xv, yv, 0.75), _run(plain, xv, yv, 0.75)
    assert got.dtype == np.float32 and got.shape == (3, 5)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.cuda
def test_the_generated_kernel_needs_no_member_kernels_until_inputs_broadcast() -> None:
    from numba import cuda

    g = cg.Graph()
    with g.as_default():
        a = cg.placeholder((None, None), name="a")
        b = cg.placeholder((None, None), name="b")
        cg.exp(a * b) + b
    [segment] = find_segments([n for n in g.nodes if n.op != "Placeholder"], set())

    def member(*xs: object) -> None:
        raise AssertionError("a member kernel ran")

    run = segment_kernel(segment, [member] * len(segment.nodes))
    av, bv = np.full((2, 3), 0.5, np.float32), np.full((2, 3), 2.0, np.float32)
    got = run(cuda.to_device(av), cuda.to_device(bv)).copy_to_host()
    np.testing.assert_allclose(got, np.exp(av * bv) + bv, rtol=1e-6)
    got = run(cuda.to_device(av), cuda.to_device(bv[:1, :1])).copy_to_host()  # one value: still fused
    np.testing.assert_allclose(got, np.exp(av * 2.0) + 2.0, rtol=1e-6)
    with pytest.raises(AssertionError, match="a member kernel ran"):
        run(cuda.to_device(av), cuda.to_device(bv[:1]))  # (2, 3) with (1, 3): op by op


@pytest.mark.cuda
def test_true_broadcasting_runs_the_kernels_one_by_one() -> None:
    g = cg.Graph()
    with g.as_default():
        col = cg.placeholder((None, 1), name="col")
        row = cg.placeholder((1, None), name="row")
        s = cg.placeholder((), name="s")
        out = cg.maximum(col * s + row, 0.0) * 3.0 - s
    fused, plain = _plans(out, [col, row, s])
    assert any(len(step.nodes) > 1 for step in fused.steps)
    colv, rowv = np.arange(3.0).reshape(3, 1), np.arange(4.0).reshape(1, 4) - 2
    got = _run(fused, colv, rowv, 0.5)  # (3, 1) with (1, 4): op by op
    assert got.shape == (3, 4)
    np.testing.assert_allclose(got, _run(plain, colv, rowv, 0.5))
    np.testing.assert_allclose(got, np.maximum(colv * 0.5 + rowv, 0) * 3 - 0.5)
    ones = np.ones((1, 1))
    got = _run(fused, colv, ones, 0.5)  # now every input is one value or the output's shape
    np.testing.assert_allclose(got, _run(plain, colv, ones, 0.5))


@pytest.mark.cuda
@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")  # the simulator computes in NumPy
def test_division_by_zero_gives_inf_fused_as_unfused() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((3,), name="x")
        z = cg.placeholder((3,), name="z")
        out = (x * 2.0) / z + 1.0
    fused, plain = _plans(out, [x, z])
    assert [len(step.nodes) for step in fused.steps if not step.constant] == [3]
    xv, zv = np.array([1.0, -1.0, 0.0]), np.array([0.0, 0.0, 2.0])
    got, want = _run(fused, xv, zv), _run(plain, xv, zv)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, [np.inf, -np.inf, 1.0])


@pytest.mark.cuda
def test_one_value_and_empty_constants_shape_the_fused_kernels_output() -> None:
    # As on the CPU: a literal's rank counts, and an empty constant is never read at [i] (the simulator raised
    # IndexError; a GPU would have read past it).
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((), name="x")
        ranked = (x + cg.constant(np.array([[2.0]], np.float32))) * 3.0
        empty = cg.exp(x + cg.constant(np.zeros((0, 3), np.float32))) * 2.0
    for out, want in ((ranked, np.array([[9.0]], np.float32)), (empty, np.zeros((0, 3), np.float32))):
        fused, plain = _plans(out, [x])
        got = _run(fused, np.float32(1.0))
        assert got.shape == want.shape == _run(plain, np.float32(1.0)).shape
        np.testing.assert_allclose(got, want, rtol=1e-6)
