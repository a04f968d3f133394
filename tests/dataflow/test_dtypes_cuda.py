"""The CUDA column of the narrow dtypes: small ints run on the device kernels; half floats are refused there
(tests/dataflow/test_dtypes_narrow.py asserts the refusal's words, no device needed)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import cellgraph as cg
from cellgraph.dataflow.opdef import KernelContext
from cellgraph.dataflow.variables import VariableStore

Build = Callable[[cg.Tensor, cg.Tensor], cg.Tensor]
OPS: list[tuple[str, Build]] = [
    ("add",        lambda a, b: a + b),
    ("mul",        lambda a, b: a * b),
    ("maximum",    cg.maximum),
    ("less",       cg.less),
    ("neg",        lambda a, b: -a),
    ("abs",        lambda a, b: abs(a)),
    ("floordiv",   lambda a, b: a // b),
    ("reduce_sum", lambda a, b: cg.reduce_sum(a, axis=1)),
    ("reduce_max", lambda a, b: cg.reduce_max(a)),
    ("argmax",     lambda a, b: cg.argmax(a, axis=1)),
    ("cast",       lambda a, b: cg.cast(a, "float32")),
]  # fmt: skip


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16"])
@pytest.mark.parametrize(("name", "build"), OPS, ids=[n for n, _ in OPS])
def test_small_int_cuda_kernel_matches_the_cpu(name: str, build: Build, dtype: str) -> None:
    from numba import cuda

    a = np.array([[1, 2, 3], [4, 5, 126]], dtype)
    b = np.array([[3, 1, 2], [1, 7, 2]], dtype)
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((2, 3), dtype, name="a")
        y = cg.placeholder((2, 3), dtype, name="b")
        out = build(x, y)
    node = out.node
    values = [{x: a, y: b}[t] for t in node.inputs]
    kernel = node.opdef.kernels["cuda"](node, KernelContext(VariableStore()))
    got = kernel(*[cuda.to_device(v) for v in values]).copy_to_host()
    want = cg.Session(g).run(out, {x: a, y: b})
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16"])
def test_gather_on_cuda_takes_small_int_indices(dtype: str) -> None:
    from numba import cuda

    params = np.arange(8, dtype=np.float32).reshape(4, 2)
    g = cg.Graph()
    with g.as_default():
        out = cg.gather(cg.placeholder((4, 2), name="p"), cg.placeholder((2,), dtype, name="i"))
    node = out.node
    kernel = node.opdef.kernels["cuda"](node, KernelContext(VariableStore()))
    got = kernel(cuda.to_device(params), cuda.to_device(np.array([3, 1], dtype))).copy_to_host()
    np.testing.assert_array_equal(got, params[[3, 1]])
