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


BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
    "pow": np.power, "maximum": np.maximum, "minimum": np.minimum,
}  # fmt: skip


def _numeric_grads(f: object, a: np.ndarray, b: np.ndarray, eps: float = 1e-6) -> list[np.ndarray]:
    """Central finite differences of sum(f(a, b)) in float64: an independent expected value."""
    grads = []
    for which in (0, 1):
        args = [a.astype(np.float64), b.astype(np.float64)]
        grad = np.zeros_like(args[which])
        for i in np.ndindex(grad.shape):
            hi, lo = [x.copy() for x in args], [x.copy() for x in args]
            hi[which][i] += eps
            lo[which][i] -= eps
            grad[i] = (np.sum(f(*hi)) - np.sum(f(*lo))) / (2 * eps)  # type: ignore[operator]
        grads.append(grad)
    return grads


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("op", sorted(BINARY))
@pytest.mark.parametrize(
    ("static", "fed_a", "fed_b"),
    [((None, 4), (1, 4), (5, 4)), ((None, 4), (5, 4), (1, 4)), ((None, None), (5, 1), (1, 3))],
    ids=["a-stretched", "b-stretched", "both-stretched"],
)
@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])
def test_broadcast_along_unknown_dims_is_summed_back_at_run_time(
    op: str, dtype: str, static: tuple[None | int, ...], fed_a: tuple[int, ...], fed_b: tuple[int, ...], fuse: bool
) -> None:
    # Equal static shapes, (None, 4) and (None, 4), say nothing about the fed
    # ones: the gradient of the stretched side must come back at its fed shape.
    rng = np.random.default_rng(0)
    av = rng.uniform(0.5, 2.0, fed_a).astype(dtype)
    bv = rng.uniform(0.5, 2.0, fed_b).astype(dtype) + 3.0  # apart from a: max/min have no ties
    g = cg.Graph()
    with g.as_default():
        a = cg.placeholder(static, dtype, name="a")
        b = cg.placeholder(static, dtype, name="b")
        da, db = cg.gradients(cg.reduce_sum(getattr(cg, op)(a, b)), [a, b])
    got = cg.Session(g, fuse=fuse).run([da, db], {a: av, b: bv})
    want = _numeric_grads(BINARY[op], av, bv)
    for value, expected, fed in zip(got, want, (fed_a, fed_b)):
        assert value.shape == fed and value.dtype == dtype
        np.testing.assert_allclose(value, expected, rtol=1e-3 if dtype == "float32" else 1e-6, atol=1e-6)


def test_the_issue_reproduction_gives_shape_1_4_and_tens() -> None:
    g = cg.Graph()
    with g.as_default():
        a = cg.placeholder((None, 4), name="a")
        b = cg.placeholder((None, 4), name="b")
        (da,) = cg.gradients(cg.reduce_sum(a * b), [a])
    out = cg.Session(g).run(da, {a: np.ones((1, 4), np.float32), b: np.full((5, 4), 2, np.float32)})
    np.testing.assert_array_equal(out, np.full((1, 4), 10, np.float32))


def test_a_sum_back_is_left_out_where_shapes_provably_match() -> None:
    # The static fast path: (None, 3) + (3,) keeps x's batch dim, so x's
    # gradient needs no SumToShapeOf; b's does.
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 3), name="x")
        b = cg.placeholder((3,), name="b")
        cg.gradients(cg.reduce_sum(x + b), [x, b])
    sums = [n for n in g.nodes if n.op == "SumToShapeOf"]
    assert [n.inputs[1].name for n in sums] == ["b:0"]


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


@pytest.mark.parametrize("activation", ["tanh", "sigmoid", "relu"])
def test_a_rank_0_gradient_summed_back_stays_an_array(activation: str) -> None:
    # The sum-back of a broadcast scalar feeds a Numba gradient kernel, which needs an array.
    g = cg.Graph()
    with g.as_default():
        s = cg.placeholder((), "float64", name="s")
        v = cg.placeholder((3,), "float64", name="v")
        [ds] = cg.gradients(cg.reduce_sum(getattr(cg, activation)(s) * v), [s])
    got = cg.Session(g).run(ds, {s: 0.5, v: np.ones(3)})
    y = {"tanh": np.tanh(0.5), "sigmoid": 1 / (1 + np.exp(-0.5)), "relu": 0.5}[activation]
    slope = {"tanh": 1 - y * y, "sigmoid": y * (1 - y), "relu": 1.0}[activation]
    np.testing.assert_allclose(got, 3 * slope, rtol=1e-12)


def test_the_second_derivative_of_a_mean_over_an_empty_batch_is_zero() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 4), "float64", name="x")
        u = cg.placeholder((4,), "float64", name="u")
        [dx] = cg.gradients(cg.reduce_mean(x, 0), [x], grad_ys=u)
        [du] = cg.gradients(cg.reduce_sum(dx), [u])
    sess = cg.Session(g)
    np.testing.assert_array_equal(sess.run(du, {x: np.zeros((0, 4)), u: np.ones(4)}), np.zeros(4))
    np.testing.assert_allclose(sess.run(du, {x: np.zeros((5, 4)), u: np.ones(4)}), np.ones(4))


def test_a_seed_must_have_its_ys_shape_when_built_and_when_run() -> None:
    """grad_ys of another shape went into the rules as given: fed (1,) for a (3,) sigmoid, the fused run broadcast
    it and the unfused one returned a (1,) gradient for the (3,) input, both without a word."""
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None,), "float64", name="x")
        y = cg.sigmoid(x)
        seed = cg.placeholder((None,), "float64", name="seed")
        [dx] = cg.gradients(y, [x], grad_ys=[seed])
        with pytest.raises(cg.GradientError) as err:
            cg.gradients(y, [x], grad_ys=[cg.placeholder((None, 1), "float64", name="column")])
    assert str(err.value) == "grad_ys[0] ('column:0') has shape (None, 1) but ys[0] ('sigmoid:0') has (None,)"
    xs = np.array([0.1, 0.2, 0.3])
    for fuse in (True, False):
        sess = cg.Session(g, fuse=fuse)
        with pytest.raises(
            cg.ExecutionError,
            match=r"ReshapeLike 'gradients/grad_ys_in_the_shape_of_ys'.*'seed:0' has shape \(1,\) but must have the shape",
        ):
            sess.run(dx, {x: xs, seed: np.ones(1)})
        slope = 1 / (1 + np.exp(-xs)) * (1 - 1 / (1 + np.exp(-xs)))
        np.testing.assert_allclose(sess.run(dx, {x: xs, seed: np.full(3, 2.0)}), 2 * slope, rtol=1e-12)


def test_a_seed_fed_transposed_fails_the_run_naming_both_shapes() -> None:
    """A (3, 2) seed for a (2, 3) y is of y's size: reshaped, it weighted the wrong elements without a word."""
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, None), "float64", name="x")
        seed = cg.placeholder((None, None), "float64", name="seed")
        [dx] = cg.gradients(x * x, [x], grad_ys=[seed])
    sess = cg.Session(g)
    xs, weights = np.ones((2, 3)), np.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(sess.run(dx, {x: xs, seed: weights}), 2 * weights)
    with pytest.raises(cg.ExecutionError) as err:
        sess.run(dx, {x: xs, seed: weights.T})
    assert "ReshapeLike 'gradients/grad_ys_in_the_shape_of_ys'" in str(err.value)
    assert str(err.value).endswith("'seed:0' has shape (3, 2) but must have the shape of 'mul:0', (2, 3)")
