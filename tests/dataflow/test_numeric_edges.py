"""Silent wrong numbers at the edges, each found by probing against PyTorch 2.13 (CPU) and float64 NumPy.

Every test here failed before its fix: a NaN that max, argmax and max_pool dropped unless it came first; float32
sums and running sums that stopped counting at 2**24; log-softmax and cross-entropy that rounded the log of the
sum away at huge logits; pow's gradients NaN at a zero base; a loss scale doubled to inf in float32.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import cellgraph as cg

from ..oracle import NO_TORCH
from .errors_helpers import raises

torch = pytest.importorskip("torch", reason=NO_TORCH)
F = torch.nn.functional


def _run(build: Callable[..., Any], *arrays: np.ndarray, fuse: bool = True) -> Any:
    """``build`` over one placeholder per array, run on those arrays."""
    g = cg.Graph()
    with g.as_default():
        phs = [cg.placeholder(a.shape, a.dtype.name, name=f"x{i}") for i, a in enumerate(arrays)]
        out = build(*phs)
    return cg.Session(g, fuse=fuse).run(out, dict(zip(phs, arrays)))


def _value_and_grad(build: Callable[..., Any], *arrays: np.ndarray) -> list[np.ndarray]:
    """``build``'s output and the gradient of its sum for each input."""
    return _run(lambda *xs: [build(*xs), *cg.gradients(cg.reduce_sum(build(*xs)), list(xs))], *arrays)


def _torch_value_and_grad(fn: Callable[..., Any], *arrays: np.ndarray) -> list[np.ndarray]:
    leaves = [torch.tensor(a, requires_grad=True) for a in arrays]
    out = fn(*leaves)
    return [out.detach().numpy(), *(g.numpy() for g in torch.autograd.grad(out.sum(), leaves))]


# ------------------------------------------------------------ NaN in max, min, argmax, argmin, max_pool
NAN_ROWS = [[np.nan, 1, 3, -2], [1, np.nan, 3, -2], [1, 3, -2, np.nan], [1, np.nan, np.nan, 5], [1, 3, 3, -2]]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("axis", [0, 1])
def test_max_min_argmax_argmin_see_a_nan_wherever_it_stands(dtype: str, axis: int) -> None:
    # Before: reduce_max([1, nan, 3]) was 3 and argmax 2; only a leading NaN gave NaN.
    x = np.array(NAN_ROWS, dtype)
    x = x if axis == 1 else np.ascontiguousarray(x.T)
    got = _run(lambda t: [cg.reduce_max(t, axis), cg.reduce_min(t, axis), cg.argmax(t, axis), cg.argmin(t, axis)], x)
    t = torch.from_numpy(x)
    want = [t.amax(axis), t.amin(axis), t.argmax(axis), t.argmin(axis)]
    for what, g, w in zip(("max", "min", "argmax", "argmin"), got, want):
        np.testing.assert_array_equal(g, w.numpy(), err_msg=what)
    np.testing.assert_array_equal(got[2], np.argmax(x, axis))  # NumPy agrees: the first NaN's index


def test_max_over_several_axes_and_keepdims_sees_a_nan() -> None:
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    x[1, 2, 1] = np.nan
    got = _run(lambda t: [cg.reduce_max(t, [0, 2], keepdims=True), cg.reduce_min(t, [0, 2])], x)
    np.testing.assert_array_equal(got[0], np.max(x, axis=(0, 2), keepdims=True))
    np.testing.assert_array_equal(got[1], np.min(x, axis=(0, 2)))
    assert np.isnan(got[0][0, 2, 0]) and np.isnan(got[1][2])


def test_max_pool_gives_nan_for_a_window_holding_one_and_routes_its_gradient_there() -> None:
    # Before: a window [1, nan, 3, 4] pooled to 4 (torch: nan), and the gradient went to the 4.
    x = np.array([1, np.nan, 3, 4, 5, 6, 7, 8], np.float32).reshape(1, 2, 4, 1)
    got = _value_and_grad(lambda t: cg.max_pool(t, 2, 2, "VALID"), x)
    nchw = lambda t: F.max_pool2d(t.permute(0, 3, 1, 2), 2).permute(0, 2, 3, 1)  # noqa: E731
    want = _torch_value_and_grad(nchw, x)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    pooled, where = _run(lambda t: list(cg.max_pool_with_argmax(t, 2, 2, "VALID")), x)
    np.testing.assert_array_equal(pooled, want[0])
    np.testing.assert_array_equal(where.ravel(), [1, 7])  # the NaN's flat index, then the 8's


@pytest.mark.parametrize(
    ("op", "torch_reduce"), [(cg.tensor_scatter_nd_max, "amax"), (cg.tensor_scatter_nd_min, "amin")]
)
def test_tensor_scatter_max_and_min_keep_a_nan_from_either_side(op: Callable[..., Any], torch_reduce: str) -> None:
    # Before: tensor_scatter_nd_max([1, 5, 2], [[0], [1], [1]], [nan, 3, nan]) was [1, 5, 2] (its NumPy reference,
    # np.maximum, and torch give [nan, nan, 2]); a NaN already in the tensor survived only by standing first.
    data = np.array([1.0, 5.0, 2.0, np.nan], np.float32)
    rows = np.array([[0], [1], [1], [3]], np.int32)
    updates = np.array([np.nan, 3.0, np.nan, 4.0], np.float32)
    got = _run(lambda d, i, u: op(d, i, u), data, rows, updates)
    index = torch.from_numpy(rows[:, 0].astype(np.int64))
    want = torch.from_numpy(data).scatter_reduce(0, index, torch.from_numpy(updates), torch_reduce)
    np.testing.assert_array_equal(got, want.numpy())
    np.testing.assert_array_equal(got, [np.nan, np.nan, 2.0, np.nan])


# ------------------------------------------------------------ long float32 sums
LONG = 2**24 + 2**20  # past 2**24, where a float32 running total of ones stops growing


def test_float32_sums_and_means_count_past_2_to_the_24() -> None:
    ones = np.ones(LONG, np.float32)
    total, mean, per_column = _run(
        lambda t: [cg.reduce_sum(t), cg.reduce_mean(t), cg.reduce_sum(cg.reshape(t, (-1, 2)), axis=0)], ones
    )
    assert total == LONG, f"sum of {LONG} float32 ones gave {total} (16777216 is where float32 stops counting)"
    assert mean == 1.0, mean
    np.testing.assert_array_equal(per_column, [LONG // 2, LONG // 2])


def test_float32_cumsum_and_logsumexp_count_past_2_to_the_24() -> None:
    zeros = np.zeros(LONG, np.float32)
    running, lse = _run(lambda t: [cg.cumsum(t + 1.0, axis=0), cg.reduce_logsumexp(t)], zeros)
    assert running[-1] == LONG and running[2**24 + 1] == 2**24 + 2, running[-3:]
    assert lse == np.float32(math.log(LONG)), f"logsumexp of {LONG} zeros gave {lse}, not log({LONG})"


def test_float32_sum_of_a_million_values_is_within_an_ulp_of_float64() -> None:
    x = np.random.default_rng(3).uniform(0, 1, 1_000_000).astype(np.float32)
    truth = x.astype(np.float64).sum()
    total, running = _run(lambda t: [cg.reduce_sum(t), cg.cumsum(t, axis=0)], x)
    eps = np.finfo(np.float32).eps  # one float32 rounding of the float64 total
    assert abs(total - truth) <= eps * truth, (total, truth)
    assert abs(running[-1] - truth) <= eps * truth, (running[-1], truth)


@pytest.mark.parametrize("add", [cg.bias_add, lambda x, b: x + b], ids=["bias_add", "broadcast add"])
def test_the_bias_gradient_of_many_rows_is_within_an_ulp_of_float64(add: Callable[..., cg.Tensor]) -> None:
    # Before: BiasAddGrad, and SumToShapeOf (np.sum over the rows), added 400000 rows one by one in float32: 1e-5 off.
    dy = (np.random.default_rng(4).standard_normal((400_000, 4)) + 0.1).astype(np.float32)
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 4), name="x")
        b = cg.variable(np.zeros(4, np.float32), name="b")
        (grad,) = cg.gradients(add(x, b), [b], grad_ys=[cg.constant(dy)])
    got = cg.Session(g).run(grad, {x: np.zeros_like(dy)})
    truth = dy.astype(np.float64).sum(axis=0)
    assert np.all(np.abs(got - truth) <= np.finfo(np.float32).eps * np.abs(truth)), (got, truth)


def test_integer_sums_still_wrap_in_their_dtype_as_tensorflow_does() -> None:
    # The float64 accumulator is for float32 only: int32 sums wrap (TensorFlow's rule; torch widens to int64).
    x = np.full(3, 2**30, np.int32)
    total, running = _run(lambda t: [cg.reduce_sum(t), cg.cumsum(t, axis=0)], x)
    assert total.dtype == np.int32 and total == np.int32(-(2**30)), total
    np.testing.assert_array_equal(running, np.cumsum(x, dtype=np.int32))


# ------------------------------------------------------------ log-softmax, cross-entropy at huge logits
HUGE = [[1e30, 1e30, 1e30], [3e38, 3e38, -3e38], [-1e30, -1e30, 0.0], [1e8, 1e8 + 8, 1e8]]


@pytest.mark.parametrize("fuse", [True, False])
def test_log_softmax_at_huge_logits_matches_torch(fuse: bool) -> None:
    # Before: x - (max + log(sum)) rounded log(sum) away: log_softmax([1e30] * 3) was [0, 0, 0], not -log 3.
    x = np.array(HUGE, np.float32)
    weights = np.array([[1.0, 2.0, 3.0]], np.float32)
    got = _run(lambda t: [cg.log_softmax(t), *cg.gradients(cg.reduce_sum(cg.log_softmax(t) * weights), [t])], x)
    # torch in float64 is the truth: its float32 log_softmax rounds log(1 + 2 e**-8) in float32 (2e-5 off).
    leaf = torch.tensor(x.astype(np.float64), requires_grad=True)
    want = torch.log_softmax(leaf, -1)
    (want_grad,) = torch.autograd.grad((want * torch.from_numpy(weights.astype(np.float64))).sum(), [leaf])
    with np.errstate(over="ignore"):  # -6e38 is -inf in float32
        want32 = want.detach().numpy().astype(np.float32)
    np.testing.assert_allclose(got[0], want32, rtol=1e-6)
    np.testing.assert_allclose(got[1], want_grad.numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got[0][0], -math.log(3), rtol=1e-6)


def test_sparse_cross_entropy_at_huge_logits_matches_torch() -> None:
    x = np.array(HUGE, np.float32)
    labels = np.array([0, 1, 2, 1], np.int32)
    got = _run(lambda t, y: cg.sparse_softmax_cross_entropy(t, y), x, labels)
    want = F.cross_entropy(torch.from_numpy(x.astype(np.float64)), torch.from_numpy(labels).long(), reduction="none")
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-6)
    np.testing.assert_allclose(got[0], math.log(3), rtol=1e-6)


# ------------------------------------------------------------ pow's gradient at a zero base
def test_pow_gradients_at_a_zero_base_match_torch() -> None:
    # Before: d/dx at 0**0 was NaN (0 * 0**-1), d/dy at 0**0 was -inf and at 0**1 NaN (0 * log 0).
    base = np.array([0.0, 0.0, 0.0, 2.0, 3.0, 0.0], np.float64)
    power = np.array([0.0, 1.0, 2.5, 0.0, 2.0, 0.5], np.float64)
    got = _value_and_grad(lambda a, b: cg.pow(a, b), base, power)
    want = _torch_value_and_grad(torch.pow, base, power)
    for what, g, w in zip(("value", "d/dbase", "d/dexponent"), got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, err_msg=what)
    assert got[1][0] == 0.0 and got[2][0] == 0.0 and got[2][1] == 0.0


def test_pow_gradient_of_a_negative_base_in_the_exponent_stays_nan_as_in_torch() -> None:
    got = _value_and_grad(lambda a, b: cg.pow(a, b), np.array([-2.0]), np.array([2.0]))
    assert got[0] == 4.0 and got[1] == -4.0 and np.isnan(got[2][0]), got


# ------------------------------------------------------------ the loss scale in float32
def _mp_step(initial_scale: float, loss_value: float, steps: int) -> list[float]:
    """The loss scale after each of ``steps`` steps of SGD on ``loss_value * w`` (growth_interval 1)."""
    g = cg.Graph()
    with g.as_default():
        w = cg.variable(np.ones(2, np.float32), name="w")
        mp = cg.optim.mixed_precision(cg.optim.SGD(0.1), initial_scale=initial_scale, growth_interval=1)
        loss = cg.cast(cg.reduce_sum(mp.cast(w)), "float32") * loss_value
        train = mp.minimize(loss)
    sess = cg.Session(g)
    scales = []
    for _ in range(steps):
        sess.run(train)
        assert mp.loss_scale is not None
        scales.append(float(sess.run(mp.loss_scale)))
    return scales


def test_the_loss_scale_stops_doubling_below_float32s_inf() -> None:
    # Before: 2**127 doubled to 2**128, stored as inf in the float32 variable; every later step was then skipped
    # (inf * 0 is NaN) and the halved scale stayed inf. torch.amp.GradScaler keeps the scale when the doubled
    # one is not finite in float32, and so does this.
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no step may be skipped
        scales = _mp_step(2.0**126, 0.0, 3)
    assert scales == [2.0**127, 2.0**127, 2.0**127], scales


def test_an_initial_loss_scale_past_float32_is_refused() -> None:
    with raises(
        ValueError, "mixed_precision: initial_scale 1e+39 does not fit the float32 loss scale (at most 3.40282e+38)"
    ):
        cg.optim.mixed_precision(cg.optim.SGD(0.1), initial_scale=1e39)


# ------------------------------------------------------------ fused tanh at saturation
def test_fused_tanh_is_exactly_one_where_float32_tanh_is_as_unfused() -> None:
    # Before: the fused loop's tanh clamped its input at 7.9 and gave 0.9999997 for tanh(50), so 1 - y**2 was 6e-7.
    x = np.array([9.02, 10, 50, 1e4, np.inf, -9.02, -50, -np.inf, 0.5, 3, np.nan], np.float32)

    def build(t: cg.Tensor) -> list[cg.Tensor]:
        y = cg.tanh(t * 1.0) * 1.0  # a chain of three: fused into one loop
        return [y, 1.0 - y * y]

    fused, unfused = _run(build, x, fuse=True), _run(build, x, fuse=False)
    np.testing.assert_array_equal(fused[0][:8], [1, 1, 1, 1, 1, -1, -1, -1])
    np.testing.assert_array_equal(fused[1][:8], np.zeros(8, np.float32))
    np.testing.assert_array_equal(fused[0][:8], unfused[0][:8])
    np.testing.assert_allclose(fused[0][8:10], np.tanh(x[8:10].astype(np.float64)), rtol=4e-7)
    assert np.isnan(fused[0][10])


def test_a_fused_loops_source_names_the_helpers_it_inlines() -> None:
    # Numba's cache checks only the cached function's own file: without the helpers' digest in the loop's source
    # (and so in its file name), a loop cached before a fix to scalar.py kept running the old code.
    import hashlib
    from pathlib import Path

    from cellgraph.dataflow.fusion import find_segments
    from cellgraph.dataflow.kernels.cpu import scalar, vector_f32
    from cellgraph.dataflow.kernels.fused_source import loop_source

    g = cg.Graph()
    with g.as_default():
        y = cg.tanh(cg.placeholder((4,), name="x") * 2.0) + 1.0
    (segment,) = find_segments([n for n in g.nodes if n.op in ("Mul", "Tanh", "Add")], set())
    assert y.node is segment.nodes[-1]
    helpers = hashlib.sha256(Path(str(scalar.__file__)).read_bytes() + Path(str(vector_f32.__file__)).read_bytes())
    assert f"# scalar helpers {helpers.hexdigest()[:16]}" in loop_source(segment)


# ------------------------------------------------------------ numbers past a float dtype's range
def test_a_feed_past_a_float_dtypes_range_is_refused_not_made_inf() -> None:
    # Before: float32 data holding 1e5 fed to a float16 placeholder became inf (NumPy's cast only warns).
    g = cg.Graph()
    with g.as_default():
        h = cg.placeholder((2,), "float16", name="h")
        b = cg.placeholder((2,), "bfloat16", name="b")
        f = cg.placeholder((2,), "float32", name="f")
        out = [h * 1.0, b * 1.0, f * 1.0]
    sess = cg.Session(g)
    fine = {h: np.array([65519.0, -1.0], np.float32), b: np.ones(2), f: np.array([1e-50, 3e38])}
    np.testing.assert_array_equal(sess.run(out[0], {h: fine[h]}), [65504, -1])  # rounds to float16's largest
    cases = [
        (h, np.array([1.0, 1e5], np.float32), f"feed for 'h:0' ({h.node.where()}) (float32) does not fit float16: it holds 100000, "
         "past float16's largest finite value 65504"),
        (h, np.array([70000, 1]), f"feed for 'h:0' ({h.node.where()}) (int64) does not fit float16: it holds 70000, past float16's "
         "largest finite value 65504"),
        (b, np.array([1e39, 1.0]), f"feed for 'b:0' ({b.node.where()}) (float64) does not fit bfloat16: it holds 1e+39, past "
         "bfloat16's largest finite value 3.38953e+38"),
        (f, np.array([-1e39, 1.0]), f"feed for 'f:0' ({f.node.where()}) (float64) does not fit float32: it holds -1e+39, past "
         "float32's largest finite value 3.40282e+38"),
    ]  # fmt: skip
    for ph, value, message in cases:
        with raises(cg.DTypeError, message):
            sess.run(out, {**fine, ph: value})
    # Infinities and NaNs already in the data are the data: they pass.
    got = sess.run(out[0], {h: np.array([np.inf, np.nan], np.float32)})
    assert np.isinf(got[0]) and np.isnan(got[1])


def test_constants_variables_and_operands_past_a_float_dtypes_range_are_refused() -> None:
    g = cg.Graph()
    with g.as_default():
        h = cg.placeholder((2,), "float16", name="h")
        x = cg.placeholder((2,), "float32", name="x")
        positive = h > 0
        before = len(g.nodes)
        cases: list[tuple[Callable[[], Any], str]] = [
            (lambda: cg.constant([1.0, 1e5], "float16", name="c"),
             "constant 'c' as float16: it holds 100000, past float16's largest finite value 65504"),
            (lambda: cg.variable(np.array([1e40]), name="w"),
             "variable 'w' as float32: it holds 1e+40, past float32's largest finite value 3.40282e+38"),
            (lambda: cg.variable(2**40, dtype="int32", name="n"),
             "variable 'n' as int32: it holds 1099511627776, outside int32's range [-2147483648, 2147483647]"),
            (lambda: h * 70000.0,
             "Mul: cannot use 70000.0 as a float16 value: it holds 70000, past float16's largest finite value 65504; "
             "compute in float32 (cg.cast(x, 'float32'))"),
            (lambda: cg.where(positive, h, -1e9),
             "Where: cannot use -1000000000.0 as a float16 value: it holds -1e+09, past float16's largest finite "
             "value 65504; compute in float32 (cg.cast(x, 'float32'))"),
            (lambda: x + 1e39,
             "Add: cannot use 1e+39 as a float32 value: it holds 1e+39, past float32's largest finite value "
             "3.40282e+38; compute in float64 (cg.cast(x, 'float64'))"),
        ]  # fmt: skip
        for build, message in cases:
            with raises(cg.DTypeError, message):
                build()
        assert len(g.nodes) == before  # nothing was added by a refused request
        # Values that fit, and the infinities a user writes, are taken as they are.
        kept = [h * -np.inf, h * 65504.0, cg.constant([np.inf], "float16"), x * 3e38]
    got = cg.Session(g).run(kept, {h: np.ones(2, np.float16), x: np.ones(2, np.float32)})
    assert np.all(got[0] == -np.inf) and np.all(got[1] == 65504) and got[2][0] == np.inf


# ------------------------------------------------------------ clipping half gradients
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_clip_by_global_norm_of_half_gradients_matches_torch(dtype: str) -> None:
    # Before: 300 squared is inf in float16, the global norm was inf and every clipped gradient 0.
    grads = [np.array([300.0, 1.0], np.float32), np.array([1e-3], np.float32)]
    g = cg.Graph()
    with g.as_default():
        tensors = [cg.constant(a, dtype) for a in grads]
        clipped, norm = cg.optim.clip_by_global_norm(tensors, 1.0)
    got = cg.Session(g).run([*clipped, norm])
    params = [torch.zeros(a.shape, dtype=getattr(torch, dtype), requires_grad=True) for a in grads]
    for p, a in zip(params, grads):
        p.grad = torch.from_numpy(a).to(p.dtype)
    want_norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
    assert norm.dtype == dtype and got[2].dtype.name == dtype
    tolerance = 1e-3 if dtype == "float16" else 8e-3  # one rounding to the half type
    np.testing.assert_allclose(float(got[2]), float(want_norm), rtol=tolerance)
    for mine, p in zip(got[:2], params):
        assert p.grad is not None
        np.testing.assert_allclose(mine.astype(np.float32), p.grad.float().numpy(), rtol=tolerance)
    np.testing.assert_allclose(got[0].astype(np.float32), [1.0, 1 / 300], rtol=tolerance)


def test_maximum_and_minimum_give_a_ties_gradient_to_x_as_tensorflow_does() -> None:
    # A deliberate choice (dataflow/ops/math.py): TensorFlow's rule, where PyTorch gives each side half.
    x, y = np.array([1.0, 2.0, 3.0]), np.array([1.0, 3.0, 2.0])
    for op, to_x in ((cg.maximum, [1.0, 0.0, 1.0]), (cg.minimum, [1.0, 1.0, 0.0])):
        _, dx, dy = _value_and_grad(op, x, y)
        np.testing.assert_array_equal(dx, to_x)
        np.testing.assert_array_equal(dy, 1.0 - np.array(to_x))


# ------------------------------------------------------------ normalization of a row holding an inf
@pytest.mark.parametrize("kind", ["layer_norm", "batch_norm"])
def test_a_row_or_channel_holding_an_inf_normalizes_to_nan_as_in_torch(kind: str) -> None:
    # Before: its variance was NaN, ``var + eps > 0`` was false, and 1/sqrt went to the inf meant for a constant
    # row with epsilon 0: the row came out as infinities (layer_norm gave [nan, -inf, inf, ...], not NaN).
    x = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    x[0, 2], x[2, 1], x[3, 3] = np.inf, np.nan, -np.inf
    gamma, beta = np.ones(6, np.float32), np.zeros(6, np.float32)
    weights = np.random.default_rng(1).standard_normal((4, 6)).astype(np.float32)

    def build(t: cg.Tensor, g: cg.Tensor, b: cg.Tensor) -> cg.Tensor:
        if kind == "layer_norm":
            return cg.layer_norm(t, g, b) * weights
        moving = [cg.variable(np.full(6, v, np.float32), name=n, trainable=False) for n, v in (("mm", 0), ("mv", 1))]
        return cg.batch_norm(t, g, b, *moving, training=True, epsilon=1e-5) * weights

    got = _value_and_grad(build, x, gamma, beta)

    def torch_build(t: Any, g: Any, b: Any) -> Any:
        if kind == "layer_norm":
            return F.layer_norm(t, (6,), g, b) * torch.from_numpy(weights)
        return F.batch_norm(t, None, None, g, b, training=True, eps=1e-5) * torch.from_numpy(weights)

    want = _torch_value_and_grad(torch_build, x, gamma, beta)
    for what, mine, theirs in zip(("value", "dx", "dgamma", "dbeta"), got, want):
        np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-5, equal_nan=True, err_msg=what)
    assert np.isnan(got[0][0]).all() if kind == "layer_norm" else np.isnan(got[0][:, 2]).all()


# ------------------------------------------------------------ activation gradients in the negative tail
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(("op", "torch_op"), [(cg.elu, F.elu), (cg.selu, F.selu)], ids=["elu", "selu"])
def test_elu_and_selu_gradients_keep_their_tail(
    op: Callable[..., cg.Tensor], torch_op: Callable[..., Any], dtype: str
) -> None:
    # Before: the slope for x <= 0 was y + alpha, which cancels: elu'(-30) was 0 in float32 (exp(-30) = 9.4e-14)
    # and selu'(-17.3) 2**-23, twice the truth.
    x = np.array([-700.0, -100.0, -30.0, -17.31, -5.0, -1e-3, 0.0, 2.0], dtype)
    got = _value_and_grad(lambda t: op(t) * 1.0, x)
    want = _torch_value_and_grad(torch_op, x)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6 if dtype == "float32" else 1e-14)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-6 if dtype == "float32" else 1e-14, atol=0)


def test_float32_reduce_prod_agrees_with_cumprod_and_float64() -> None:
    # Before: reduce_prod multiplied in float32 (5e-5 off for a million factors near 1), cumprod in float64.
    x = (1 + np.random.default_rng(5).uniform(-1e-3, 1e-3, 1_000_000)).astype(np.float32)
    total, running = _run(lambda t: [cg.reduce_prod(t), cg.cumprod(t, axis=0)], x)
    truth = np.prod(x.astype(np.float64))
    assert abs(total - truth) <= np.finfo(np.float32).eps * truth, (total, truth)
    assert total == running[-1]


def test_fused_maximum_and_minimum_keep_a_nan_on_either_side() -> None:
    # Before: a fused loop computed max(a, b) with Python's max, which gives max(1.0, nan) = 1.0, so a fused
    # maximum(a, b) dropped a NaN in b while the op-by-op kernel (np.maximum) kept it.
    a = np.array([1.0, np.nan, 2.0, -np.inf], np.float32)
    b = np.array([np.nan, 1.0, np.nan, 3.0], np.float32)

    def build(x: cg.Tensor, y: cg.Tensor) -> list[cg.Tensor]:
        return [cg.maximum(x * 1.0, y * 1.0) * 1.0, cg.minimum(x * 1.0, y * 1.0) * 1.0]

    for fuse in (True, False):
        got = _run(build, a, b, fuse=fuse)
        np.testing.assert_array_equal(got[0], np.maximum(a, b), err_msg=f"fuse={fuse}")
        np.testing.assert_array_equal(got[1], np.minimum(a, b), err_msg=f"fuse={fuse}")


def test_an_ignored_example_with_an_infinite_loss_adds_nothing_as_in_torch() -> None:
    # Before: an ignored row's loss (computed for a stand-in class 0 whose logit is -inf: inf) was multiplied by 0,
    # giving NaN, and the whole mean was NaN; torch's cross_entropy(ignore_index=) leaves the row out.
    logits = np.array([[1.0, 2.0, 0.5], [-np.inf, 0.0, 1.0], [0.3, 0.2, 0.1]], np.float32)
    labels = np.array([1, -100, 2], np.int32)
    got = _run(
        lambda x, y: [
            cg.losses.sparse_softmax_cross_entropy(x, y, ignore_index=-100),
            *cg.gradients(cg.losses.sparse_softmax_cross_entropy(x, y, ignore_index=-100), [x]),
        ],
        logits,
        labels,
    )
    leaf = torch.tensor(logits, requires_grad=True)
    want = F.cross_entropy(leaf, torch.from_numpy(labels).long(), ignore_index=-100)
    (want_grad,) = torch.autograd.grad(want, [leaf])
    np.testing.assert_allclose(got[0], want.detach().numpy(), rtol=1e-6)
    np.testing.assert_allclose(got[1], want_grad.numpy(), rtol=1e-5, atol=1e-7)


# ------------------------------------------------------------ floored division of floats
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_float_floordiv_is_pythons_and_agrees_with_floormod(dtype: str) -> None:
    # Before: floor(a / b), which rounds a / b first: 1.0 // 0.1 was 10 beside 1.0 % 0.1 = 0.0999...
    # (Python, NumPy and PyTorch: 9), and -1e4 // inf was -0 (they give -1).
    a = np.array([1.0, 1.0, 0.3, -1.0, 7.0, -1e4, 5.0, 0.0, -0.0, 3.0, -3.0, np.nan], dtype)
    b = np.array([0.1, 0.01, 0.1, 0.1, 0.7, np.inf, -np.inf, 2.0, 2.0, 0.0, 0.0, 1.0], dtype)
    with np.errstate(divide="ignore", invalid="ignore"):
        quotient, remainder = _run(lambda x, y: [cg.floordiv(x, y), cg.floormod(x, y)], a, b)
        want = torch.floor_divide(torch.from_numpy(a), torch.from_numpy(b)).numpy()
        numpy = np.floor_divide(a, b)
    np.testing.assert_array_equal(quotient, numpy)
    np.testing.assert_array_equal(quotient, want)
    np.testing.assert_array_equal(np.signbit(quotient), np.signbit(numpy))
    assert quotient[0] == 9.0 and quotient[5] == -1.0
    finite = np.isfinite(a) & np.isfinite(b) & (b != 0)
    np.testing.assert_allclose(quotient[finite] * b[finite] + remainder[finite], a[finite], rtol=1e-6, atol=1e-6)


def test_a_bool_sum_is_refused_not_an_or() -> None:
    # Before: reduce_sum of [True] * 4 gave True (bool + bool stored in a bool), where NumPy and PyTorch count 4;
    # TensorFlow refuses a bool sum, and so does cellgraph now, pointing to the cast that counts.
    g = cg.Graph()
    with g.as_default():
        mask = cg.placeholder((4,), "bool", name="mask")
        before = len(g.nodes)
        with raises(cg.DTypeError, "expects a float or int tensor, got bool; count with reduce_sum(cast(x, 'int32'))"):
            cg.reduce_sum(mask)
        assert len(g.nodes) == before
        count = cg.reduce_sum(cg.cast(mask, "int32"))
    assert cg.Session(g).run(count, {mask: np.array([True, True, False, True])}) == 3
