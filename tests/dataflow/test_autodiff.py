from __future__ import annotations

import numpy as np
import pytest

import cellgraph as cg
from cellgraph.dataflow.opdef import OPS, OpDef, register_op
from cellgraph.dataflow.ops.base import apply, infer_same


def test_fan_out_gradients_are_summed() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((3,), "float64", name="x")
        y = cg.reduce_sum(x * x + x * 3.0 + cg.exp(x))
        [dx] = cg.gradients(y, [x])
    xv = np.array([0.1, 0.2, 0.3])
    np.testing.assert_allclose(cg.Session(g).run(dx, {x: xv}), 2 * xv + 3 + np.exp(xv))


def test_broadcast_gradients_are_summed_to_input_shape() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 3), name="x")
        b = cg.placeholder((3,), name="b")
        s = cg.placeholder((), name="s")
        [db, ds] = cg.gradients(cg.reduce_sum((x + b) * s), [b, s])
    assert db.shape == (3,) and ds.shape == ()
    out = cg.Session(g).run([db, ds], {x: np.ones((4, 3)), b: np.zeros(3), s: 2.0})
    np.testing.assert_allclose(out[0], [8.0, 8.0, 8.0])
    np.testing.assert_allclose(out[1], 12.0)


def test_no_path_gives_none_and_integer_ys_are_rejected() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((2,), name="x")
        z = cg.placeholder((2,), name="z")
        assert cg.gradients(cg.reduce_sum(x), [z]) == [None]
        # argmax is not differentiable: a recorded decision, nothing flows.
        assert cg.gradients(cg.cast(cg.argmax(x, 0), "float32"), [x]) == [None]
        with pytest.raises(
            cg.GradientError, match=r"cannot differentiate 'argmax_1:0': its dtype is int32, not a float"
        ):
            cg.gradients(cg.argmax(x, 0), [x])


def test_a_wrong_gradient_rule_fails_at_its_own_op() -> None:
    def wrong_rule(node, dys):  # noqa: ANN001, ANN202
        return [cg.reduce_sum(dys[0])]  # a scalar, for a (2, 3) input

    register_op(OpDef(name="TestBrokenGrad", family="test", infer=infer_same, reference=lambda a, x: x, grad=wrong_rule,
                      kernels={"cpu": lambda n, c: lambda x: x}))  # fmt: skip
    try:
        g = cg.Graph()
        with g.as_default():
            x = cg.placeholder((2, 3), name="x")
            y = apply("TestBrokenGrad", [x], name="broken")
            with pytest.raises(
                cg.GradientError,
                match=r"gradient rule of TestBrokenGrad 'broken' \(test_autodiff.py:\d+\) returned \(\) float32 for input 0 \('x:0'\), which is \(2, 3\) float32",
            ):
                cg.gradients(cg.reduce_sum(y), [x])
    finally:
        OPS._values.pop("TestBrokenGrad")
        OPS._where.pop("TestBrokenGrad")


def test_gradient_ops_are_colocated_with_their_forward_ops() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((2, 2), name="x")
        w = cg.variable(np.ones((2, 2), np.float32), name="w")
        y = x @ w
        [dw] = cg.gradients(cg.reduce_sum(y), [w])
    assert dw.node.attrs["_colocate"] == "matmul"
