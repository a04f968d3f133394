"""The second set of elementwise ops: their errors (with the words a user reads), the Python
operators installed on Tensor, stop_gradient, the semantics the docstrings promise, and fusion."""

from __future__ import annotations

import re

import numpy as np
import pytest

import cellgraph as cg
from cellgraph.dataflow.ops import operators

from .errors_helpers import ph, raises

pytestmark = pytest.mark.usefixtures("fresh_graph")


def _run(fetches, feeds=None):  # noqa: ANN001, ANN202
    return cg.Session(cg.get_default_graph()).run(fetches, feeds or {})


# ------------------------------------------------------------------ errors
def test_a_logical_op_on_floats_names_the_op_node_line_and_both_dtypes() -> None:
    pattern = (
        r"^LogicalAnd 'both' \(test_elementwise_more\.py:\d+\): expects bool tensors, got float32 and float32 "
        r"\(&, \|, \^ and ~ are logical operators on bool tensors; cellgraph has no bitwise integer ops\)$"
    )
    with pytest.raises(cg.DTypeError, match=pattern):
        cg.logical_and(ph(3), ph(3, name="y"), name="both")


@pytest.mark.parametrize(
    ("build", "op", "words"),
    [
        (lambda f, i, b: f & b, "LogicalAnd", "expects bool tensors, got float32 and bool"),
        (lambda f, i, b: b | i, "LogicalOr", "expects bool tensors, got bool and int32"),
        (lambda f, i, b: i ^ i, "LogicalXor", "expects bool tensors, got int32 and int32"),
        (lambda f, i, b: ~i, "LogicalNot", "expects a bool tensor, got int32 (&, |, ^ and ~ are logical operators"),
        (lambda f, i, b: cg.is_nan(i), "IsNan", "expects a float tensor, got int32"),
        (lambda f, i, b: cg.is_finite(b), "IsFinite", "expects a float tensor, got bool"),
        (lambda f, i, b: cg.floor(i), "Floor", "expects a float tensor, got int32"),
        (lambda f, i, b: cg.erf(i), "Erf", "expects a float tensor, got int32"),
        (lambda f, i, b: cg.gelu(i), "Gelu", "expects a float tensor, got int32"),
        (lambda f, i, b: cg.leaky_relu(b), "LeakyRelu", "expects a float tensor, got bool"),
        (lambda f, i, b: abs(b), "Abs", "expects a float or int tensor, got bool"),
        (lambda f, i, b: cg.sign(b), "Sign", "expects a float or int tensor, got bool"),
        (lambda f, i, b: b // b, "FloorDiv", "expects float or int tensors, got bool"),
        (lambda f, i, b: f % i, "FloorMod", "operands have different dtypes: float32 and int32"),
        (lambda f, i, b: cg.not_equal(f, i), "NotEqual", "operands have different dtypes: float32 and int32"),
        (lambda f, i, b: f > i, "Less", "operands have different dtypes: int32 and float32"),
    ],
)
def test_dtype_errors_name_the_op_and_the_dtypes(build, op: str, words: str) -> None:  # noqa: ANN001
    f, i, b = ph(4), ph(4, dtype="int32", name="i"), ph(4, dtype="bool", name="b")
    before = len(cg.get_default_graph().nodes)
    with pytest.raises(cg.DTypeError, match=rf"^{op} '\w+' \(test_elementwise_more\.py:\d+\): " + re.escape(words)):
        build(f, i, b)
    assert len(cg.get_default_graph().nodes) == before  # a rejected op leaves nothing behind


def test_where_errors() -> None:
    c, x = ph(3, dtype="bool", name="c"), ph(3)
    with raises(cg.DTypeError, "condition must be a bool tensor, got float32"):
        cg.where(x, x, x)
    with raises(cg.DTypeError, "x and y have different dtypes: float32 and int32"):
        cg.where(c, x, ph(3, dtype="int32", name="i"))
    with raises(cg.ShapeError, "shapes do not broadcast: condition (3,), x (3,), y (2, 4)"):
        cg.where(c, x, ph(2, 4, name="y"))
    with raises(cg.DTypeError, "Where: cannot use 0.5 as a bool value"):
        cg.where(0.5, x, x)


def test_clip_by_value_errors() -> None:
    x = ph(None, 3)
    with raises(cg.DTypeError, "t, clip_value_min and clip_value_max differ in dtype: float32, float64, float32"):
        cg.clip_by_value(x, ph(dtype="float64", name="lo"), ph(name="hi"))
    with raises(cg.ShapeError, "shapes do not broadcast: t (None, 3), clip_value_min (4,), clip_value_max ()"):
        cg.clip_by_value(x, np.zeros(4, np.float32), 1.0)
    with raises(cg.DTypeError, "ClipByValue: cannot use 0.5 as an int32 value: it is not a whole number"):
        cg.clip_by_value(ph(3, dtype="int32", name="i"), 0.5, 3)
    with raises(cg.DTypeError, "expects float or int tensors, got bool"):
        cg.clip_by_value(ph(3, dtype="bool", name="b"), False, True)


def test_activation_attr_errors() -> None:
    x = ph(3)
    with raises(TypeError, "leaky_relu: alpha must be a real number, got '0.1' (str)"):
        cg.leaky_relu(x, alpha="0.1")  # type: ignore[arg-type]
    with raises(TypeError, "elu: alpha must be a real number, got True (bool)"):
        cg.elu(x, alpha=True)
    with raises(ValueError, "gelu: approximate must be False, True, 'none' or 'tanh', got 'erf'"):
        cg.gelu(x, approximate="erf")


# --------------------------------------------------------------- operators
def test_python_operators_build_the_ops() -> None:
    x, i, b = ph(4), ph(4, dtype="int32", name="i"), ph(4, dtype="bool", name="b")
    cases = {
        "Pow": [2.0**x, x**2],
        "Abs": [abs(x), abs(i)],
        "Less": [x < 0.5, x > 0.5, 0.5 < x],
        "GreaterEqual": [x <= 0.5, x >= 0.5],
        "FloorDiv": [x // 2.0, 7 // i],
        "FloorMod": [i % 3, 7.0 % x],
        "LogicalAnd": [b & b, True & b],
        "LogicalOr": [b | False],
        "LogicalXor": [b ^ b, False ^ b],
        "LogicalNot": [~b],
    }
    for op, tensors in cases.items():
        assert {t.op for t in tensors} == {op}, op
    xv = np.array([-1.5, 0.25, 2.0, 3.0], np.float32)
    iv = np.array([-7, 7, 3, -2], np.int32)
    bv = np.array([True, False, True, False])
    got = _run([2.0**x, 7 // i, i % 3, 7.0 % x, x > 0.5, True & b, ~b], {x: xv, i: iv, b: bv})
    np.testing.assert_allclose(got[0], 2.0**xv, rtol=1e-6)
    np.testing.assert_array_equal(got[1], [7 // int(v) for v in iv])  # Python's floor division
    np.testing.assert_array_equal(got[2], [int(v) % 3 for v in iv])  # the divisor's sign, as Python's
    np.testing.assert_allclose(got[3], [7.0 % float(v) for v in xv], rtol=1e-6)
    np.testing.assert_array_equal(got[4], xv > 0.5)
    np.testing.assert_array_equal(got[5], bv)
    np.testing.assert_array_equal(got[6], ~bv)


def test_equality_stays_identity_and_chained_comparisons_are_refused() -> None:
    x, y = ph(3), ph(3, name="y")
    assert (x == x) is True and (x == y) is False  # tensors are dict keys: == is not an op
    assert len({x: 1, y: 2}) == 2
    with pytest.raises(cg.GraphError, match="the truth value of tensor 'greater:0' is unknown until the graph runs"):
        0.0 < x < 1.0  # noqa: B015 - Python asks bool(0.0 < x) between the two comparisons


def test_operators_are_installed_once() -> None:
    assert all(getattr(cg.Tensor, name) is fn for name, fn in operators.OPERATORS.items())
    with raises(RuntimeError, "Tensor already has __rpow__: one definition per operator"):
        operators.install()


def test_an_int_divisor_of_zero_fails_the_run_naming_the_node() -> None:
    i, j = ph(3, dtype="int32", name="i"), ph(3, dtype="int32", name="j")
    q, r = cg.floordiv(i, j, name="q"), cg.mod(i, j, name="r")
    feeds = {i: np.array([7, -7, 1], np.int32), j: np.array([2, 0, 3], np.int32)}
    for t, words in ((q, "integer division by zero"), (r, "integer modulo by zero")):
        pattern = rf"^{t.op} '{t.node.name}' \(test_elementwise_more\.py:\d+\) failed while running: "
        with pytest.raises(cg.ExecutionError, match=pattern + "ZeroDivisionError: " + words + ": the divisor holds 0"):
            _run(t, feeds)
    feeds[j] = np.array([2, -2, 3], np.int32)
    np.testing.assert_array_equal(_run([q, r], feeds), [[3, 3, 0], [1, -1, 1]])  # Python: -7 % -2 == -1
    x = ph(2, name="x")  # floats follow IEEE: x // 0 is inf, x % 0 is NaN
    got = _run([x // 0.0, x % 0.0], {x: np.array([1.0, -1.0], np.float32)})
    np.testing.assert_array_equal(got[0], [np.inf, -np.inf])
    assert np.isnan(got[1]).all()


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64"])
def test_the_lowest_int_over_minus_one_is_refused_not_a_crash(dtype: str) -> None:
    # The CPU's division instruction traps on it (SIGFPE killed the process, a notebook's kernel
    # with it). The remainder is 0; the quotient does not fit, so it is refused, not wrapped.
    lowest, highest = np.iinfo(dtype).min, np.iinfo(dtype).max
    i, j = ph(3, dtype=dtype, name="i"), ph(3, dtype=dtype, name="j")
    q, r = cg.floordiv(i, j, name="q"), cg.mod(i, j, name="r")
    feeds = {i: np.array([lowest, -7, lowest], dtype), j: np.array([-1, 2, 3], dtype)}
    np.testing.assert_array_equal(_run(r, feeds), [0, 1, lowest % 3])
    pattern = r"^FloorDiv 'q' \(test_elementwise_more\.py:\d+\) failed while running: OverflowError: "
    words = f"integer division overflows {dtype}: {lowest} // -1 = {-lowest}, above the largest {dtype} ({highest})"
    with pytest.raises(cg.ExecutionError, match=pattern + re.escape(words) + "$"):
        _run(q, feeds)
    feeds[j] = np.array([1, 2, 3], dtype)
    np.testing.assert_array_equal(_run(q, feeds), [lowest, -4, lowest // 3])


# ----------------------------------------------------------- stop_gradient
def test_stop_gradient_passes_values_and_blocks_gradients() -> None:
    x = ph(3)
    y = x * cg.stop_gradient(x)  # d/dx treats the stopped factor as a constant: x, not 2x
    dx, none = cg.gradients(cg.reduce_sum(y), [x]) + cg.gradients(cg.stop_gradient(x) * 2.0, [x])
    xv = np.array([1.0, -2.0, 3.0], np.float32)
    value, grad = _run([y, dx], {x: xv})
    np.testing.assert_array_equal(value, xv * xv)
    np.testing.assert_array_equal(grad, xv)
    assert none is None


SMOOTH = {
    "sin": cg.sin, "cos": cg.cos, "tan": cg.tan, "rsqrt": lambda t: cg.rsqrt(t + 2.0), "log1p": cg.log1p,
    "expm1": cg.expm1, "erf": cg.erf, "elu": lambda t: cg.elu(t, 0.5), "selu": cg.selu, "gelu": cg.gelu,
    "gelu_tanh": lambda t: cg.gelu(t, approximate=True), "softplus": cg.softplus, "softsign": cg.softsign,
    "silu": cg.silu, "clip": lambda t: cg.clip_by_value(t * t, 0.1, 0.5),
}  # fmt: skip


@pytest.mark.parametrize("name", list(SMOOTH))
def test_second_derivatives_match_differences_of_the_first(name: str) -> None:
    """The gradient rules are built from differentiable ops, so they differentiate again."""
    x = ph(None, dtype="float64")
    (dx,) = cg.gradients(cg.reduce_sum(SMOOTH[name](x)), [x])
    (ddx,) = cg.gradients(cg.reduce_sum(dx), [x])  # elementwise: the Hessian's diagonal
    sess = cg.Session(cg.get_default_graph())
    points = np.array([-0.9, -0.4, 0.3, 0.8])  # clear of every kink (elu's, selu's and clip's)
    eps = 1e-6
    numeric = (sess.run(dx, {x: points + eps}) - sess.run(dx, {x: points - eps})) / (2 * eps)
    np.testing.assert_allclose(sess.run(ddx, {x: points}), numeric, rtol=1e-5, atol=1e-7)


def test_piecewise_constant_ops_give_a_zero_gradient_not_none() -> None:
    x = ph(3)
    grads = cg.gradients(cg.floor(x) + cg.ceil(x) + cg.round(x) + cg.sign(x), [x])
    np.testing.assert_array_equal(_run(grads[0], {x: np.array([0.3, -1.7, 2.5], np.float32)}), [0, 0, 0])


def test_semantics_the_docstrings_promise() -> None:
    x = ph(None)
    half = np.array([0.5, 1.5, 2.5, -0.5, -2.5], np.float32)
    np.testing.assert_array_equal(_run(cg.round(x), {x: half}), [0.0, 2.0, 2.0, -0.0, -2.0])  # ties to even
    big = np.array([-800.0, 0.0, 800.0], np.float32)
    np.testing.assert_allclose(_run(cg.softplus(x), {x: big}), [0.0, np.log(2.0), 800.0], rtol=1e-6)
    np.testing.assert_allclose(
        _run(cg.hard_sigmoid(x), {x: np.array([-3.0, 0.0, 1.5, 3.0], np.float32)}), [0.0, 0.5, 0.75, 1.0]
    )  # PyTorch's: relu6(x + 3) / 6
    # Within 1e-3 of each other over the range a model uses.
    grid = np.linspace(-5, 5, 101).astype(np.float32)
    exact, approx = _run([cg.gelu(x), cg.gelu(x, approximate="tanh")], {x: grid})
    np.testing.assert_allclose(exact, approx, atol=1e-3)


# ------------------------------------------------------------------ fusion
CHAIN = [
    cg.sin, cg.cos, cg.tan, lambda t: cg.leaky_relu(t, 0.1), lambda t: cg.elu(t, 0.5), cg.selu, cg.gelu,
        lambda t: cg.gelu(t, approximate=True), cg.softplus, cg.softsign, cg.silu, lambda t: t * 8.0, cg.relu6,
        lambda t: t - 3.0, cg.hard_sigmoid, cg.erf, cg.expm1, cg.log1p, cg.abs, lambda t: cg.rsqrt(t + 0.5),
        cg.sign, lambda t: cg.clip_by_value(t * 3.0, -0.5, 2.0),
    ]  # fmt: skip


def _chain(x: cg.Tensor) -> cg.Tensor:
    for fn in CHAIN:
        x = fn(x)
    return x


def test_new_float_ops_fuse_into_one_loop() -> None:
    x = ph(None, 4)
    out = _chain(x)
    g = cg.get_default_graph()
    feeds = {x: np.random.default_rng(3).normal(size=(5, 4)).astype(np.float32)}
    fused, plain = cg.Session(g), cg.Session(g, fuse=False)
    np.testing.assert_allclose(fused.run(out, feeds), plain.run(out, feeds), rtol=2e-5, atol=2e-6)
    calls = [s for s in fused.make_callable([out], [x]).steps if not s.constant]
    assert len(calls) == 1, [[n.op for n in c.nodes] for c in calls]  # the whole chain is one loop
    assert len(calls[0].nodes) == len(CHAIN) + 2  # and the Add and the Mul inside the last two lambdas


@pytest.mark.cuda
def test_new_float_ops_fuse_into_one_cuda_kernel() -> None:
    from numba import cuda

    from cellgraph.dataflow.executor import Plan
    from cellgraph.dataflow.variables import VariableStore

    x = ph(3, 4)
    out = _chain(x)
    value = np.random.default_rng(4).normal(size=(3, 4)).astype(np.float32)
    fused, plain = (Plan(out.graph, [out], [], [x], VariableStore(), device="cuda", fuse=f) for f in (True, False))
    assert len([s for s in fused.steps if not s.constant]) == 1
    (got,), (want,) = fused(cuda.to_device(value)), plain(cuda.to_device(value))
    np.testing.assert_allclose(got.copy_to_host(), want.copy_to_host(), rtol=2e-5, atol=2e-6)


def _where_chain() -> tuple[cg.Tensor, cg.Tensor, cg.Tensor, dict[str, np.ndarray]]:
    x, c = ph(None, 4), ph(None, None, dtype="bool", name="c")
    out = cg.sin(cg.where(c, x, x * 0.5) * 2.0) + 1.0  # Where reads a bool; x * 0.5 is read once
    rng = np.random.default_rng(5)
    return out, x, c, {"x": rng.normal(size=(3, 4)).astype(np.float32), "c": rng.random((3, 4)) > 0.5}


def test_where_joins_a_fused_loop_with_its_bool_condition() -> None:
    out, x, c, values = _where_chain()
    feeds = {x: values["x"], c: values["c"]}
    fused = cg.Session(cg.get_default_graph())
    want = np.sin(np.where(values["c"], values["x"], values["x"] * 0.5) * 2.0) + 1.0
    np.testing.assert_allclose(fused.run(out, feeds), want, rtol=1e-6, atol=1e-6)
    calls = [s for s in fused.make_callable([out], [x, c]).steps if not s.constant]
    assert [n.op for n in calls[-1].nodes] == ["Mul", "Where", "Mul", "Sin", "Add"]
    # A condition holding one value is read once, before the loop.
    one = {x: values["x"], c: np.array([[True]])}
    np.testing.assert_allclose(fused.run(out, one), np.sin(values["x"] * 2.0) + 1.0, rtol=1e-6, atol=1e-6)


@pytest.mark.cuda
def test_where_joins_a_fused_cuda_kernel() -> None:
    from numba import cuda

    from cellgraph.dataflow.executor import Plan
    from cellgraph.dataflow.variables import VariableStore

    out, x, c, values = _where_chain()
    fused, plain = (Plan(out.graph, [out], [], [x, c], VariableStore(), device="cuda", fuse=f) for f in (True, False))
    assert [len(s.nodes) for s in fused.steps if not s.constant] == [5]
    args = [cuda.to_device(values["x"]), cuda.to_device(values["c"])]
    (got,), (want,) = fused(*args), plain(*args)
    np.testing.assert_allclose(got.copy_to_host(), want.copy_to_host(), rtol=2e-6)


@pytest.mark.parametrize("dtype", ["uint8"])  # cellgraph's one unsigned dtype
def test_the_sign_of_an_unsigned_int_is_one_or_zero(dtype: str) -> None:
    # Numba's np.sign went through the signed type: sign(uint8 255) was 255.
    x = np.array([0, 1, 7, np.iinfo(dtype).max], dtype)
    g = cg.Graph()
    with g.as_default():
        p = cg.placeholder((4,), dtype, name="x")
        out = cg.sign(p)
    got = cg.Session(g).run(out, {p: x})
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, [0, 1, 1, 1])
