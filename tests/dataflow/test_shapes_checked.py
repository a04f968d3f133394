"""A kernel's run-time shape check remembers the shapes that passed: it must still refuse new ones after them."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

import cellgraph as cg
from cellgraph.dataflow.opdef import KernelContext
from cellgraph.dataflow.ops import array_gather, array_slice, conv, nn
from cellgraph.dataflow.ops.base import apply
from cellgraph.dataflow.variables import VariableStore


def test_a_bias_of_other_channels_after_good_runs_still_fails_the_run() -> None:
    """The check compares the shapes with the last that passed; other shapes are checked again, every time."""
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, None), "float64", name="x")
        b = cg.placeholder((None,), "float64", name="b")
        y = cg.bias_add(x, b)
    sess = cg.Session(g)
    for _ in range(3):  # the same good shapes, then another good batch size
        np.testing.assert_array_equal(sess.run(y, {x: np.ones((2, 3)), b: np.arange(3.0)}), [[1, 2, 3]] * 2)
    np.testing.assert_array_equal(sess.run(y, {x: np.ones((4, 3)), b: np.arange(3.0)}), [[1, 2, 3]] * 4)
    for _ in range(2):  # refused each time, not only the first
        with pytest.raises(cg.ExecutionError) as err:
            sess.run(y, {x: np.ones((2, 3)), b: np.ones(1)})
        assert "bias has 1 elements but the input's last axis has 3: (2, 3) + (1,)" in str(err.value)
    # A good run after the refusals is computed as before.
    np.testing.assert_array_equal(sess.run(y, {x: np.ones((2, 3)), b: np.arange(3.0)}), [[1, 2, 3]] * 2)


POOL_GRADS = [
    # x of 2 images, dy of 3 (or of another size): the kernels read x by dy's shape.
    ("MaxPoolGrad", lambda x, dy: conv.max_pool_grad(x, dy, 2, 1, "VALID", dilations=2), (2, 5, 6, 2), (2, 2, 4, 2),
     "out_backprop has shape (2, 2, 4, 2), expected (2, 3, 4, 2)"),
    ("AvgPoolGrad", lambda x, dy: conv.avg_pool_grad(x, dy, 2, (1, 2), "VALID", dilations=(1, 3)), (2, 4, 8, 2),
     (3, 3, 3, 2), "out_backprop has shape (3, 3, 3, 2), expected (2, 3, 3, 2)"),
    ("MaxPoolGradGrad", lambda x, ddx: conv.max_pool_grad_grad(x, ddx, 3, 2, "SAME"), (2, 6, 6, 2), (2, 6, 2, 6),
     "gradient has shape (2, 6, 2, 6), expected (2, 6, 6, 2)"),
    ("MaxPool", lambda x: cg.max_pool(x, 3, 1), (1, 2, 2, 1), None,
     "window height 3 is larger than the input height 2 with VALID padding: window (3, 3) over (1, 2, 2, 1)"),
]  # fmt: skip


def _pool_node(build: Any, x_shape: tuple[int, ...], dy_shape: tuple[int, ...] | None) -> tuple[Any, list[Any]]:
    """The op ``build`` makes from float32 placeholders of unknown dims, and arrays of the shapes given."""
    g = cg.Graph()
    shapes = [x_shape] if dy_shape is None else [x_shape, dy_shape]
    with g.as_default():
        ins = [cg.placeholder((None,) * 4, "float32", name=f"in{i}") for i in range(len(shapes))]
        out = build(*ins)
    return out, [np.ones(s, np.float32) for s in shapes]


@pytest.mark.parametrize(("op", "build", "x_shape", "dy_shape", "words"), POOL_GRADS, ids=[p[0] for p in POOL_GRADS])
def test_a_pool_fed_shapes_its_rule_refuses_fails_the_run_in_the_rules_words(
    op, build, x_shape, dy_shape, words
) -> None:  # type: ignore[no-untyped-def]
    """Dims unknown when building let a dy of another batch or size through: MaxPoolGrad read past the end of x
    (a segfault), the others returned numbers without a word."""
    out, arrays = _pool_node(build, x_shape, dy_shape)
    with pytest.raises(cg.ExecutionError) as err:
        cg.Session(out.graph).run(out, dict(zip(out.node.inputs, arrays)))
    assert str(err.value).startswith(f"{op} '")
    assert str(err.value).endswith(f"ValueError: {words}")


@pytest.mark.cuda
@pytest.mark.parametrize(("op", "build", "x_shape", "dy_shape", "words"), POOL_GRADS, ids=[p[0] for p in POOL_GRADS])
def test_a_cuda_pool_refuses_the_shapes_in_the_cpu_kernels_words(op, build, x_shape, dy_shape, words) -> None:  # type: ignore[no-untyped-def]
    from numba import cuda

    out, arrays = _pool_node(build, x_shape, dy_shape)
    node = out.node
    kernel = node.opdef.kernels["cuda"](node, KernelContext(VariableStore()))
    with pytest.raises(ValueError, match=f"^{re.escape(words)}$"):
        kernel(*[cuda.to_device(a) for a in arrays])


ACTIVATION_GRADS = [("ReluGrad", nn.relu_grad), ("SigmoidGrad", nn.sigmoid_grad), ("TanhGrad", nn.tanh_grad)]


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize(("op", "grad"), ACTIVATION_GRADS, ids=[a[0] for a in ACTIVATION_GRADS])
def test_an_activation_gradient_of_another_shape_fails_the_run(op: str, grad: Any, fuse: bool) -> None:
    """The kernels walk dy and read y at the same flat index: a y of fewer rows was read past its end, and a
    (3, 4) y for a (4, 3) dy, of the same size, in the wrong order, both without a word."""
    g = cg.Graph()
    with g.as_default():
        dy = cg.placeholder((None, None), "float32", name="dy")
        y = cg.placeholder((None, None), "float32", name="y")
        dx = cg.exp(grad(cg.abs(dy), cg.abs(y)) * 2.0)  # fused with elementwise ops around it
    sess = cg.Session(g, fuse=fuse)
    assert sess.run(dx, {dy: np.ones((3, 4), np.float32), y: np.full((3, 4), 0.5, np.float32)}).shape == (3, 4)
    # (1, 1): a single value, which the fused loop broadcast (as a (1,) grad_ys seed for a (3,) sigmoid was).
    for dy_shape, y_shape in (((4, 3), (3, 4)), ((3, 4), (2, 4)), ((3, 4), (1, 1))):
        with pytest.raises(cg.ExecutionError) as err:
            sess.run(dx, {dy: np.ones(dy_shape, np.float32), y: np.ones(y_shape, np.float32)})
        assert str(err.value).endswith(f"ValueError: gradient and output shapes differ: {dy_shape} and {y_shape}")
        assert (f"{op} '" if not fuse else "Exp 'exp'") in str(err.value)


@pytest.mark.cuda
@pytest.mark.parametrize(("op", "grad"), ACTIVATION_GRADS, ids=[a[0] for a in ACTIVATION_GRADS])
def test_a_cuda_activation_gradient_refuses_another_shape_in_the_cpu_words(op: str, grad: Any) -> None:
    from numba import cuda

    g = cg.Graph()
    with g.as_default():
        node = grad(cg.placeholder((None, None), "float32"), cg.placeholder((None, None), "float32")).node
    kernel = node.opdef.kernels["cuda"](node, KernelContext(VariableStore()))
    with pytest.raises(ValueError, match=re.escape("gradient and output shapes differ: (4, 3) and (3, 4)")):
        kernel(cuda.to_device(np.ones((4, 3), np.float32)), cuda.to_device(np.ones((3, 4), np.float32)))


def _sliced(t: cg.Tensor) -> Any:
    return t[1:, ::-2].node.attrs


_normal = np.random.default_rng(0).standard_normal
ids = np.array([2, 0, 2, 1], np.int32)
batch_ids = np.array([[0, 2, 2], [1, 0, 3]], np.int32)
# Ops built by gradient rules, fed one array of another shape (of the same size where a reshape let it through).
GRADIENT_OPS = [
    ("ScatterAddLike", lambda u, i, like: array_gather._scatter_add_like(u, i, like, 0), [_normal((2, 4)), ids, _normal((3, 2))],
     "updates (2, 4) do not fit indices (4,) into (3, 2) on axis 0"),
    ("BatchGatherGrad", lambda u, i, like: apply("BatchGatherGrad", [u, i, like], {"batch_dims": 1, "axis": 1}),
     [_normal((2, 4, 3)), batch_ids, _normal((2, 3, 4))],
     "updates (2, 4, 3) do not fit indices (2, 3) into (2, 3, 4): expected (2, 3, 4)"),
    ("StridedSliceGrad", lambda g, x: array_slice._strided_slice_grad(g, x, _sliced(x)), [_normal((1, 2)), _normal((3, 4))],
     "gradient (1, 2) does not fit [1:, ::-2] of (3, 4)"),
]  # fmt: skip


@pytest.mark.parametrize(("op", "build", "arrays", "words"), GRADIENT_OPS, ids=[o[0] for o in GRADIENT_OPS])
def test_a_gradient_op_given_arrays_its_rule_refuses_fails_the_run(op, build, arrays, words) -> None:  # type: ignore[no-untyped-def]
    g = cg.Graph()
    with g.as_default():
        ins = [cg.placeholder((None,) * a.ndim, a.dtype.name, name=f"in{i}") for i, a in enumerate(arrays)]
        out = build(*ins)
    assert out.node.op == op
    with pytest.raises(cg.ExecutionError) as err:
        cg.Session(g).run(out, dict(zip(ins, arrays)))
    assert str(err.value).startswith(f"{op} '")
    assert str(err.value).endswith(f"ValueError: {words}")
