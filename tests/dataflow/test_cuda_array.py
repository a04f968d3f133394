"""CUDA array kernels where the op table cannot look: run-time errors, atomics, views.

The op table's CUDA column compares every array kernel with the reference on
good inputs. Here: a bad run-time input fails on the device with the CPU
kernel's exception and words; scatter-add sums repeated indices exactly;
reshapes launch nothing. The ``cuda`` tests run on a GPU, or on Numba's
simulator (small shapes: it is slow); the slow test at the end runs them on
the simulator in a subprocess.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import cellgraph as cg
from cellgraph.dataflow.opdef import KernelContext
from cellgraph.dataflow.ops import array, array_gather
from cellgraph.dataflow.variables import VariableStore


def _kernels(build: Callable[..., Any], *static: tuple[int | None, ...], dtypes: tuple[str, ...] = ()) -> Any:
    """The cpu and cuda kernels of the node ``build`` makes from placeholders of shapes ``static``."""
    g = cg.Graph()
    with g.as_default():
        names = dtypes or ("float32",) * len(static)
        out = build(*(cg.placeholder(shape, dtype) for shape, dtype in zip(static, names)))
    node = out.node
    ctx = KernelContext(VariableStore())
    return node.opdef.kernels["cpu"](node, ctx), node.opdef.kernels["cuda"](node, ctx)


def _device(*values: np.ndarray) -> list[Any]:
    from numba import cuda

    return [cuda.to_device(np.array(v, order="C")) for v in values]


def _same_error(build: Callable[..., Any], static: list[tuple[int | None, ...]], values: list[np.ndarray],
                dtypes: tuple[str, ...] = ()) -> None:  # fmt: skip
    """The cuda kernel raises what the cpu kernel raises, with the same words."""
    cpu, gpu = _kernels(build, *static, dtypes=dtypes)
    with pytest.raises(Exception) as on_cpu:
        cpu(*values)
    with pytest.raises(on_cpu.type, match=f"^{re.escape(str(on_cpu.value))}$"):
        gpu(*_device(*values))


params = np.arange(12, dtype=np.float32).reshape(3, 4)


@pytest.mark.cuda
def test_same_shape_reshape_like_refuses_a_transposed_array_as_the_cpu_kernel_does() -> None:
    mask, like = np.ones((3, 2), np.float32), np.zeros((2, 3), np.float32)  # (time, batch) for (batch, time)
    build = lambda x, y: array.reshape_like(x, y, same_shape=True)  # noqa: E731
    _same_error(build, [(None, None), (None, None)], [mask, like])
    cpu, gpu = _kernels(build, (None, None), (None, None))
    np.testing.assert_array_equal(gpu(*_device(like, like)).copy_to_host(), cpu(like, like))


@pytest.mark.cuda
@pytest.mark.parametrize("bad", [3, -1, 7], ids=["n", "negative", "far"])
def test_gather_index_out_of_range_is_the_cpu_error(bad: int) -> None:
    indices = np.array([[0, 2], [bad, 1]], np.int32)
    _same_error(lambda p, i: cg.gather(p, i), [(None, 4), (None, None)], [params, indices], ("float32", "int32"))


@pytest.mark.cuda
def test_gather_names_the_first_bad_index_when_several_are() -> None:
    indices = np.array([1, 5, 0, -2, 9], np.int64)
    cpu, gpu = _kernels(lambda p, i: cg.gather(p, i, axis=1), (3, None), (None,), dtypes=("float32", "int64"))
    with pytest.raises(IndexError, match=re.escape("index 5 (at (1,) in indices) is out of range [0, 4) for axis 1")):
        gpu(*_device(params, indices))


@pytest.mark.cuda
def test_gather_checks_indices_when_nothing_is_copied() -> None:
    """params with a zero-size dim: no element moves, the indices are still checked (as on the CPU)."""
    empty = np.zeros((0, 3), np.float32)
    _same_error(lambda p, i: cg.gather(p, i, axis=1), [(None, 3), (None,)], [empty, np.array([3], np.int32)],
                ("float32", "int32"))  # fmt: skip


@pytest.mark.cuda
def test_gather_of_a_scalar_index_and_of_no_indices() -> None:
    _, gpu = _kernels(lambda p, i: cg.gather(p, i), (None, 4), (), dtypes=("float32", "int32"))
    got = gpu(*_device(params, np.array(2, np.int32)))
    np.testing.assert_array_equal(got.copy_to_host(), params[2])
    _, gpu = _kernels(lambda p, i: cg.gather(p, i), (None, 4), (None,), dtypes=("float32", "int32"))
    assert gpu(*_device(params, np.zeros(0, np.int32))).copy_to_host().shape == (0, 4)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64"])
def test_scatter_add_sums_repeated_indices_exactly(dtype: str) -> None:
    """Every update lands on one of two rows, 32 of them on each element: the atomic adds
    lose none (integer-valued floats, so the order of the adds cannot change the sum)."""
    indices = np.array([1, 0] * 32, np.int32)
    updates = np.arange(64 * 3).reshape(64, 3).astype(dtype)
    like = np.zeros((3, 3), dtype)
    cpu, gpu = _kernels(lambda u, i, lk: array_gather._scatter_add_like(u, i, lk, 0), (None, 3), (None,), (None, 3),
                        dtypes=(dtype, "int32", dtype))  # fmt: skip
    got = gpu(*_device(updates, indices, like)).copy_to_host()
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, cpu(updates, indices, like))
    np.testing.assert_array_equal(got[2], 0)


@pytest.mark.cuda
def test_scatter_add_index_out_of_range_is_the_cpu_error() -> None:
    _same_error(lambda u, i, lk: array_gather._scatter_add_like(u, i, lk, 1), [(2, None), (None,), (2, None)],
                [np.ones((2, 3), np.float32), np.array([0, 4, 1], np.int32), np.zeros((2, 4), np.float32)],
                ("float32", "int32", "float32"))  # fmt: skip


@pytest.mark.cuda
def test_slice_out_of_bounds_at_run_time_is_the_cpu_error() -> None:
    _same_error(lambda x: cg.slice(x, (1, 0), (3, -1)), [(None, 2)], [np.ones((3, 2), np.float32)])


@pytest.mark.cuda
def test_strided_slice_int_out_of_range_at_run_time_is_the_cpu_error() -> None:
    _same_error(lambda x: x[:, 4], [(2, None)], [np.ones((2, 3), np.float32)])
    _same_error(lambda x: x[-4], [(None,)], [np.ones(3, np.float32)])


@pytest.mark.cuda
def test_squeeze_of_a_dim_that_is_not_one_is_the_cpu_error() -> None:
    _same_error(lambda x: cg.squeeze(x, 1), [(2, None)], [np.ones((2, 3), np.float32)])


@pytest.mark.cuda
def test_split_like_pieces_that_do_not_add_up_are_the_cpu_error() -> None:
    _same_error(lambda g, a, b: array._split_like(g, [a, b], 0)[0], [(None,), (None,), (None,)],
                [np.ones(5, np.float32), np.ones(2, np.float32), np.ones(2, np.float32)])  # fmt: skip


@pytest.mark.cuda
def test_empty_inputs_concat_pad_and_one_hot() -> None:
    a, b = np.ones((2, 0), np.float32), np.arange(4, dtype=np.float32).reshape(2, 2)
    _, gpu = _kernels(lambda x, y: cg.concat([x, y], 1), (2, None), (2, None))
    np.testing.assert_array_equal(gpu(*_device(a, b)).copy_to_host(), b)
    _, gpu = _kernels(lambda i: cg.one_hot(i, 0), (None,), dtypes=("int32",))
    assert gpu(*_device(np.array([0, 1], np.int32))).copy_to_host().shape == (2, 0)
    _, gpu = _kernels(lambda x: cg.pad(x, ((1, 1), (0, 0)), constant_values=3), (None, 2))
    np.testing.assert_array_equal(gpu(*_device(np.ones((0, 2), np.float32))).copy_to_host(), np.full((2, 2), 3))


@pytest.mark.cuda
@pytest.mark.parametrize(
    "build",
    [lambda x: cg.reshape(x, (3, 4)), lambda x: cg.expand_dims(x, 0), lambda x: cg.squeeze(x, 0),
     lambda x: cg.transpose(x, (1, 0, 2))],
    ids=["reshape", "expand_dims", "squeeze", "transpose-of-a-size-1-dim"],
)  # fmt: skip
def test_views_launch_no_kernel(build: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from cellgraph.dataflow.kernels.cuda import array as kernels

    def no_launch(*args: Any) -> None:
        raise AssertionError("a view launched a copy kernel")

    monkeypatch.setattr(kernels, "_copy", no_launch)
    x = np.arange(12, dtype=np.float32).reshape(1, 12, 1)
    _, gpu = _kernels(build, (1, 12, 1))
    got = gpu(*_device(x))
    # The values are the op table's business; here: the same elements, in order.
    assert got.copy_to_host().ravel().tolist() == x.ravel().tolist()
