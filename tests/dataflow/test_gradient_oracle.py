"""cg.gradients against PyTorch's autograd on the inputs where gradient rules go wrong: ties, bounds, zeros.

The standing oracle (tests/oracle/) draws uniform random inputs, where no two values tie and nothing sits on
a kink. Here every case is chosen to sit on one: relu, relu6, clip and abs at their corners, maxima with
several equal candidates, max pooling over a plateau, products and cumulative products through zeros, sqrt,
rsqrt and log at 0, pow of negative bases, the losses with ignored and weighted examples, every broadcasting
pattern of the binary ops, strided, dilated and padded convolutions, and second derivatives (a gradient
penalty) through the activations, the normalizations and products. Each case runs in float64 op by op
(tight) and in float32 through fused loops (loose), and compares the value and the gradient of ``sum(out * w)``
for random ``w``.

Where the two libraries choose differently at a tie, cellgraph keeps TensorFlow's documented rule and the
torch side is written to state it (each such case says so):

- ``maximum``/``minimum`` give a tie's whole gradient to x (TF's ``_MaximumGrad``: ``x >= y``); torch halves it.
- ``reduce_max``/``reduce_min`` share it equally among the tied values (TF's ``_MinOrMaxGrad``; torch's
  ``amax``/``amin`` agree).
- ``tensor_scatter_nd_max``/``_min`` share it equally among the tensor's value and the updates equal to the
  result (TF's ``TensorScatterMax`` gradient; torch's ``scatter_reduce(..., include_self=True)`` agrees).
- ``max_pool`` sends it to the first maximum of each window in row-major order (TF's ``MaxPoolGrad``; torch's
  ``max_pool2d`` agrees).
- ``relu`` and ``relu6`` pass nothing at their corners and ``clip_by_value`` passes all at its bounds (TF and
  torch agree); ``abs`` passes 0 at 0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

import cellgraph as cg

from ..oracle import NO_TORCH

torch = pytest.importorskip("torch", reason=NO_TORCH)
F = torch.nn.functional

TOLERANCES = {"float64": (1e-9, 1e-10), "float32": (2e-5, 2e-5)}
RNG = np.random.default_rng(20261204)


def _normal(*shape: int) -> np.ndarray:
    return RNG.normal(size=shape)


def _ints(*values: Any) -> np.ndarray:
    return np.array(values, np.int32)


def _run_cellgraph(
    build: Callable[..., Any], arrays: Sequence[np.ndarray], weights: np.ndarray, fuse: bool
) -> tuple[np.ndarray, list[np.ndarray | None]]:
    g = cg.Graph()
    with g.as_default():
        inputs = [cg.placeholder(a.shape, a.dtype.name, name=f"in{i}") for i, a in enumerate(arrays)]
        out = build(*inputs)
        w = cg.placeholder(weights.shape, weights.dtype.name, name="w")
        floats = [t for t, a in zip(inputs, arrays) if a.dtype.kind == "f"]
        grads = cg.gradients(cg.reduce_sum(out * w), floats)
    feeds = {**dict(zip(inputs, arrays)), w: weights}
    values = cg.Session(g, fuse=fuse).run([out, *[d for d in grads if d is not None]], feeds)
    rest = iter(values[1:])
    return values[0], [None if d is None else next(rest) for d in grads]


def _run_torch(fn: Callable[..., Any], arrays: Sequence[np.ndarray], weights: np.ndarray) -> tuple[Any, list[Any]]:
    leaves = [torch.tensor(a, requires_grad=a.dtype.kind == "f") for a in arrays]
    out = fn(*leaves)
    floats = [t for t in leaves if t.requires_grad]
    grads = torch.autograd.grad((out * torch.from_numpy(weights)).sum(), floats, allow_unused=True)
    return out.detach().numpy(), [None if d is None else d.numpy() for d in grads]


def _check(label: str, build: Any, fn: Any, arrays: Sequence[np.ndarray], dtype: str, fuse: bool) -> None:
    arrays = [a.astype(dtype) if a.dtype.kind == "f" else a for a in arrays]
    rtol, atol = TOLERANCES[dtype]
    shape = np.shape(fn(*[torch.from_numpy(a) for a in arrays]).detach())
    weights = np.random.default_rng(len(label)).uniform(0.5, 1.5, shape).astype(dtype)
    got, got_grads = _run_cellgraph(build, arrays, weights, fuse)
    want, want_grads = _run_torch(fn, arrays, weights)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True, err_msg=f"{label}: value")
    floats = [a for a in arrays if a.dtype.kind == "f"]
    for i, (a, mine, theirs) in enumerate(zip(floats, got_grads, want_grads)):
        expected = np.zeros(a.shape, dtype) if theirs is None else theirs
        assert mine is not None or not np.any(expected), f"{label}: no gradient for input {i}, torch's {expected}"
        mine = np.zeros(a.shape, dtype) if mine is None else mine
        assert mine.shape == a.shape and mine.dtype == a.dtype, f"{label}: input {i} got {mine.shape} {mine.dtype}"
        np.testing.assert_allclose(
            mine, expected, rtol=rtol, atol=atol, equal_nan=True, err_msg=f"{label}: gradient of input {i}"
        )


# ------------------------------------------------------------------ helpers for NHWC layouts
def _nhwc(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A torch function of NCHW images, applied to NHWC ones (cellgraph's layout)."""
    return lambda a, *rest: fn(a.permute(0, 3, 1, 2), *rest).permute(0, 2, 3, 1)


def _torch_conv(a: Any, w: Any, stride: Any = 1, pads: Sequence[int] = (0, 0, 0, 0), **kw: Any) -> Any:
    """conv2d of NHWC ``a`` by HWIO ``w``; ``pads`` is (left, right, top, bottom), TF's SAME being uneven."""
    x = F.pad(a.permute(0, 3, 1, 2), tuple(pads))
    return F.conv2d(x, w.permute(3, 2, 0, 1), stride=stride, **kw).permute(0, 2, 3, 1)


def _torch_depthwise(a: Any, w: Any, stride: int = 1, pads: Sequence[int] = (0, 0, 0, 0), dilation: int = 1) -> Any:
    kh, kw, c, m = w.shape
    filters = w.permute(2, 3, 0, 1).reshape(c * m, 1, kh, kw)
    x = F.pad(a.permute(0, 3, 1, 2), tuple(pads))
    return F.conv2d(x, filters, stride=stride, dilation=dilation, groups=c).permute(0, 2, 3, 1)


def _torch_conv_transpose(a: Any, w: Any, stride: int, crop: tuple[int, int, int, int], dilation: int = 1) -> Any:
    """conv2d_transpose of NHWC ``a`` by TF's (h, w, out, in) filters: torch's full output, then TF's crop
    (top, bottom, left, right), which puts SAME's odd pixel at the end."""
    full = F.conv_transpose2d(a.permute(0, 3, 1, 2), w.permute(3, 2, 0, 1), stride=stride, dilation=dilation)
    top, bottom, left, right = crop
    return full[:, :, top : full.shape[2] - bottom, left : full.shape[3] - right].permute(0, 2, 3, 1)


def _torch_pool(a: Any, kind: str, k: int, s: int, pads: tuple[int, int, int, int]) -> Any:
    """max or average pool of NCHW ``a`` with TF's padding (left, right, top, bottom): padding never wins a max
    and is not counted in an average (TF's SAME; torch's ``count_include_pad=False`` needs even padding)."""
    fill = -np.inf if kind == "max" else 0.0
    x = F.pad(a, pads, value=fill)
    if kind == "max":
        return F.max_pool2d(x, k, s)
    counts = F.avg_pool2d(F.pad(torch.ones_like(a), pads), k, s)
    return F.avg_pool2d(x, k, s) / counts


def _sparse_xent(logits: Any, labels: Any, weights: Any, ignore: int) -> Any:
    """cellgraph's documented mean: sum(w * loss) / sum(w) over the examples kept (torch's weighted mean)."""
    kept = (labels != ignore).to(logits.dtype)
    per_example = F.cross_entropy(logits, labels.long().clamp(min=0), reduction="none") * weights * kept
    return per_example.sum() / (weights * kept).sum()


def _variables(n: int, dtype: str = "float64") -> tuple[cg.Tensor, cg.Tensor]:
    return cg.variable(np.zeros(n), dtype=dtype), cg.variable(np.ones(n), dtype=dtype)


def _batch_norm(axis: int) -> Callable[..., Any]:
    def build(x: Any, gamma: Any, beta: Any) -> Any:
        mean, var = _variables(gamma.shape[0], gamma.dtype)
        return cg.batch_norm(x, gamma, beta, mean, var, training=True, axis=axis)

    return build


def _torch_batch_norm(channels_last: bool) -> Callable[..., Any]:
    def fn(x: Any, gamma: Any, beta: Any) -> Any:
        if channels_last and x.ndim == 4:
            return _nhwc(lambda a: F.batch_norm(a, None, None, gamma, beta, True, 0.0, 1e-3))(x)
        return F.batch_norm(x, None, None, gamma, beta, True, 0.0, 1e-3)

    return fn


def _attention(q: Any, k: Any, v: Any, transpose_b: Callable[..., Any], matmul: Callable[..., Any], sm: Any) -> Any:
    return matmul(sm(matmul(q, transpose_b(k)) * 0.5), v)


CORNERS = np.array([[-1.0, 0.0, 1.0, 0.0], [2.0, -0.0, 3.0, 6.0]])
TIES = np.array([[1.0, 3.0, 3.0, 2.0], [5.0, 5.0, 5.0, 5.0]])
TIES3 = np.array([[[1.0, 3.0], [3.0, 2.0]], [[5.0, 5.0], [1.0, 5.0]]])
ZEROS = np.array([[1.0, 0.0, 3.0, 2.0], [0.0, 0.0, 2.0, 1.0], [1.0, 2.0, 3.0, 0.5]])
PLATEAU = np.ones((1, 4, 4, 1))
PLATEAU[0, 1, 1, 0] = 2.0
LOGITS, LABELS = _normal(5, 4), _ints(0, 1, 3, 1, 2)
SMOOTHED = np.eye(4)[LABELS] * 0.9 + 0.1 / 4
IMAGES, FILTERS = _normal(2, 7, 6, 4), _normal(3, 3, 4, 5)
EVEN = _normal(2, 4, 4, 4)

CASES: list[Any] = [
    # -------------------------------------------------------------------- activations at their corners
    ("relu-at-0", cg.relu, F.relu, [CORNERS]),
    ("relu6-at-0-and-6", cg.relu6, F.relu6, [CORNERS]),
    ("leaky-relu-at-0", lambda a: cg.leaky_relu(a, 0.2), lambda a: F.leaky_relu(a, 0.2), [CORNERS]),
    ("elu-at-0", cg.elu, F.elu, [CORNERS]),
    ("abs-at-0", cg.abs, torch.abs, [CORNERS]),
    ("clip-at-its-bounds", lambda a: cg.clip_by_value(a, 0.0, 3.0), lambda a: torch.clamp(a, 0.0, 3.0), [CORNERS]),
    ("clip-by-broadcast-tensors", cg.clip_by_value, torch.clamp,
     [CORNERS, np.array([0.0, 0.0, 1.0, 0.0]), np.array([[3.0], [3.0]])]),
    ("softplus-tails", cg.softplus, F.softplus, [np.array([-50.0, 0.0, 50.0, 700.0])]),
    # ------------------------------------------------------------------------------ maxima with ties
    ("reduce-max-ties-axis-1", lambda a: cg.reduce_max(a, 1), lambda a: torch.amax(a, 1), [TIES]),
    ("reduce-max-ties-all", cg.reduce_max, torch.amax, [TIES]),
    ("reduce-min-ties-keepdims", lambda a: cg.reduce_min(a, [0, 1], keepdims=True),
     lambda a: torch.amin(a, (0, 1), keepdim=True), [-TIES]),
    ("reduce-max-ties-axes-0-2", lambda a: cg.reduce_max(a, [0, 2]), lambda a: torch.amax(a, (0, 2)), [TIES3]),
    ("reduce-max-all-minus-inf", lambda a: cg.reduce_max(a, 1), lambda a: torch.amax(a, 1),
     [np.array([[-np.inf, -np.inf], [1.0, -np.inf]])]),
    # TF's rule at a tie (all to x), which torch halves: stated with where.
    ("maximum-ties-to-x-broadcast", cg.maximum, lambda a, b: torch.where(a >= b, a, b),
     [np.array([[1.0, 2.0, 3.0], [2.0, 2.0, 2.0]]), np.array([2.0])]),
    ("minimum-ties-to-x-broadcast", cg.minimum, lambda a, b: torch.where(a <= b, a, b),
     [np.array([[1.0, 2.0, 3.0], [2.0, 2.0, 2.0]]), np.array([[2.0], [1.0]])]),
    ("top-k-ties-by-lower-index", lambda a: cg.top_k(a, 2)[0], lambda a: torch.stack([a[:, 1], a[:, 2]], 1),
     [np.array([[1.0, 3.0, 3.0, 2.0], [2.0, 5.0, 5.0, 5.0]])]),
    # ------------------------------------------------------------------------- through zeros and near 0
    ("reduce-prod-through-zeros", lambda a: cg.reduce_prod(a, 1), lambda a: torch.prod(a, 1), [ZEROS]),
    ("reduce-prod-axes-0-keepdims", lambda a: cg.reduce_prod(a, 0, keepdims=True),
     lambda a: torch.prod(a, 0, keepdim=True), [ZEROS]),
    ("cumprod-through-zeros", lambda a: cg.cumprod(a, 1), lambda a: torch.cumprod(a, 1), [ZEROS]),
    ("cumprod-reverse-through-zeros", lambda a: cg.cumprod(a, 1, reverse=True),
     lambda a: torch.cumprod(a.flip(1), 1).flip(1), [ZEROS]),
    ("sqrt-at-0", cg.sqrt, torch.sqrt, [np.array([0.0, 1e-30, 4.0])]),
    ("rsqrt-at-0", cg.rsqrt, torch.rsqrt, [np.array([0.0, 1e-30, 4.0])]),
    ("log-at-0", cg.log, torch.log, [np.array([0.0, 1e-30, 4.0])]),
    ("log1p-at-minus-1", cg.log1p, torch.log1p, [np.array([-1.0, 0.0, 4.0])]),
    ("pow-negative-base-integer-exponents", lambda a: cg.pow(a, 3.0) + cg.pow(a, -2.0),
     lambda a: a**3.0 + a**-2.0, [np.array([-2.0, -1.5, 2.0])]),
    # ------------------------------------------------------------------- broadcasting in binary ops
    ("add-rank-difference", cg.add, torch.add, [_normal(3), _normal(2, 4, 3)]),
    ("sub-size-1-dims", cg.sub, torch.sub, [_normal(2, 1, 3), _normal(4, 1)]),
    ("mul-both-stretched", cg.mul, torch.mul, [_normal(1, 3), _normal(2, 1)]),
    ("div-scalar-denominator", cg.div, torch.div, [_normal(2, 3), np.array(1.7)]),
    ("pow-size-1-dims", cg.pow, torch.pow, [RNG.uniform(0.5, 2.0, (2, 1, 3)), RNG.uniform(0.5, 2.0, (4, 1))]),
    ("floormod-broadcast", cg.floormod, torch.remainder,
     [np.array([[5.0, -5.0, 5.5, -7.0]]), np.array([[3.0], [-2.0]])]),
    ("where-broadcast", cg.where, torch.where, [np.array([[True], [False]]), _normal(2, 3), _normal(3)]),
    ("where-unselected-nan-side", lambda c, a: cg.where(c, cg.sqrt(a), cg.zeros_like(a)),
     lambda c, a: torch.where(c, torch.sqrt(a), torch.zeros_like(a)), [np.array([True, False]), np.array([1.0, -1.0])]),
    ("bias-add", cg.bias_add, torch.add, [_normal(2, 3, 4), _normal(4)]),
    # ------------------------------------------------------------------------------------ reductions
    ("reduce-mean-axes-keepdims", lambda a: cg.reduce_mean(a, [0, 2], keepdims=True),
     lambda a: a.mean((0, 2), keepdim=True), [_normal(2, 3, 4)]),
    ("reduce-sum-negative-axes", lambda a: cg.reduce_sum(a, [-1, -3]), lambda a: a.sum((-1, -3)), [_normal(2, 3, 4)]),
    ("logsumexp-minus-inf", lambda a: cg.reduce_logsumexp(a, 1), lambda a: torch.logsumexp(a, 1),
     [np.array([[-np.inf, 0.0, 1.0], [2.0, -np.inf, 3.0]])]),
    # ------------------------------------------------------------------------------ softmax and losses
    ("softmax-masked", cg.softmax, lambda a: torch.softmax(a, -1), [np.array([[-np.inf, 0.0, 1.0], [2.0, -np.inf, 3.0]])]),
    ("log-softmax-masked", cg.log_softmax, lambda a: torch.log_softmax(a, -1),
     [np.array([[-np.inf, 0.0, 1.0], [2.0, -np.inf, 3.0]])]),
    ("log-softmax-axis-1-of-3", lambda a: cg.log_softmax(a, 1), lambda a: torch.log_softmax(a, 1), [_normal(2, 3, 4)]),
    ("sparse-xent-ignore-index", lambda z, y: cg.losses.sparse_softmax_cross_entropy(z, y, ignore_index=1),
     lambda z, y: F.cross_entropy(z, y.long(), ignore_index=1), [LOGITS, LABELS]),
    ("sparse-xent-ignore-and-weights", lambda z, y, w: cg.losses.sparse_softmax_cross_entropy(z, y, w, ignore_index=1),
     lambda z, y, w: _sparse_xent(z, y, w, 1), [LOGITS, LABELS, RNG.uniform(0.5, 2.0, 5)]),
    ("sparse-xent-3d-sum", lambda z, y: cg.losses.sparse_softmax_cross_entropy(z, y, reduction="sum"),
     lambda z, y: F.cross_entropy(z.permute(0, 2, 1), y.long(), reduction="sum"),
     [_normal(2, 3, 4), np.array([[0, 3, 3], [1, 1, 2]], np.int64)]),
    # Label smoothing (0.1) is a smoothed one-hot as dense labels: torch's label_smoothing=0.1 (its value is
    # checked against these labels' in test_dense_labels_smoothed_are_torchs_label_smoothing).
    ("dense-xent-smoothed", lambda z, y: cg.losses.softmax_cross_entropy_with_logits(z, y),
     lambda z, y: F.cross_entropy(z, y), [LOGITS, SMOOTHED]),
    ("dense-xent-wrt-labels", lambda z, y: cg.losses.softmax_cross_entropy_with_logits(z, y, reduction="none"),
     lambda z, y: F.cross_entropy(z, y, reduction="none"), [LOGITS, RNG.dirichlet(np.ones(4), 5)]),
    ("sigmoid-xent-tails", lambda z, y: cg.losses.sigmoid_cross_entropy_with_logits(z, y, reduction="none"),
     lambda z, y: F.binary_cross_entropy_with_logits(z, y, reduction="none"),
     [np.array([-50.0, -1.0, 0.0, 1.0, 50.0]), np.array([0.0, 1.0, 0.5, 0.0, 1.0])]),
    ("huber-at-delta", lambda p, t: cg.losses.huber(p, t, delta=2.0), lambda p, t: F.huber_loss(p, t, delta=2.0),
     [np.array([0.0, 1.0, 2.0, -2.0, 3.5]), np.zeros(5)]),
    # ------------------------------------------------------------------------------- normalization
    ("batch-norm-training-nhwc", _batch_norm(-1), _torch_batch_norm(True), [_normal(2, 3, 3, 4), _normal(4), _normal(4)]),
    ("batch-norm-training-nchw", _batch_norm(1), _torch_batch_norm(False), [_normal(2, 3, 2, 2), _normal(3), _normal(3)]),
    ("batch-norm-constant-channel", _batch_norm(-1), _torch_batch_norm(False),
     [np.array([[1.0, 2.0, 3.0], [1.0, 5.0, 3.0], [1.0, -2.0, 3.0]]), _normal(3), _normal(3)]),
    ("layer-norm-constant-row", cg.layer_norm, lambda a, g, b: F.layer_norm(a, (4,), g, b, 1e-5),
     [np.array([[1.0, 1.0, 1.0, 1.0], [1.0, 2.0, 3.0, 4.0]]), _normal(4), _normal(4)]),
    ("layer-norm-last-two", lambda a, g, b: cg.layer_norm(a, g, b, begin_axis=-2),
     lambda a, g, b: F.layer_norm(a, (3, 4), g, b, 1e-5), [_normal(2, 3, 4), _normal(3, 4), _normal(3, 4)]),
    # ------------------------------------------------------------------------------------- attention
    ("attention-batch-matmul", lambda q, k, v: _attention(q, k, v, lambda t: t, lambda a, b: cg.matmul(
        a, b, transpose_b=b is not v), cg.softmax),
     lambda q, k, v: _attention(q, k, v, lambda t: t.transpose(-1, -2), torch.matmul, lambda t: torch.softmax(t, -1)),
     [_normal(2, 3, 4), _normal(2, 5, 4), _normal(2, 5, 2)]),
    ("matmul-both-transposed", lambda a, b: cg.matmul(a, b, transpose_a=True, transpose_b=True),
     lambda a, b: a.T @ b.T, [_normal(4, 3), _normal(2, 4)]),
    # --------------------------------------------------------------------------- pools and convolutions
    ("max-pool-plateau-first-max", lambda a: cg.max_pool(a, 2, 2), _nhwc(lambda a: F.max_pool2d(a, 2, 2)), [PLATEAU]),
    ("max-pool-overlapping-plateau", lambda a: cg.max_pool(a, 3, 1), _nhwc(lambda a: F.max_pool2d(a, 3, 1)),
     [np.ones((1, 4, 4, 1))]),
    ("max-pool-same-even-negative", lambda a: cg.max_pool(a, 3, 2, "SAME"),
     _nhwc(lambda a: _torch_pool(a, "max", 3, 2, (0, 1, 0, 1))), [-np.abs(EVEN)]),
    ("max-pool-dilated", lambda a: cg.max_pool(a, 2, 1, dilations=2),
     _nhwc(lambda a: F.max_pool2d(a, 2, 1, dilation=2)), [_normal(1, 5, 5, 2)]),
    ("avg-pool-same-odd-stride-2", lambda a: cg.avg_pool(a, 3, 2, "SAME"),
     _nhwc(lambda a: _torch_pool(a, "avg", 3, 2, (1, 1, 1, 1))), [_normal(2, 5, 5, 2)]),
    ("avg-pool-same-even-stride-2", lambda a: cg.avg_pool(a, 3, 2, "SAME"),
     _nhwc(lambda a: _torch_pool(a, "avg", 3, 2, (0, 1, 0, 1))), [EVEN]),
    ("avg-pool-valid-rectangular", lambda a: cg.avg_pool(a, [2, 3], [1, 2]),
     _nhwc(lambda a: F.avg_pool2d(a, (2, 3), (1, 2))), [_normal(1, 4, 5, 2)]),
    ("conv-valid-stride-2-dilation-2", lambda a, w: cg.conv2d(a, w, 2, "VALID", dilations=2),
     lambda a, w: _torch_conv(a, w, 2, dilation=2), [IMAGES, FILTERS]),
    ("conv-same-stride-2-uneven-pad", lambda a, w: cg.conv2d(a, w, 2, "SAME"),
     lambda a, w: _torch_conv(a, w, 2, (0, 1, 1, 1)), [IMAGES, FILTERS]),
    ("conv-explicit-pad-strides-1-2", lambda a, w: cg.conv2d(a, w, [1, 2], [[1, 0], [2, 1]]),
     lambda a, w: _torch_conv(a, w, (1, 2), (2, 1, 1, 0)), [IMAGES, FILTERS]),
    ("conv-groups-same-even", lambda a, w: cg.conv2d(a, w, 2, "SAME", groups=2),
     lambda a, w: _torch_conv(a, w, 2, (0, 1, 0, 1), groups=2), [EVEN, _normal(3, 3, 2, 6)]),
    ("depthwise-same-even-stride-2", lambda a, w: cg.depthwise_conv2d(a, w, 2, "SAME"),
     lambda a, w: _torch_depthwise(a, w, 2, (0, 1, 0, 1)), [EVEN, _normal(3, 3, 4, 2)]),
    ("depthwise-same-dilation-2", lambda a, w: cg.depthwise_conv2d(a, w, 1, "SAME", dilations=2),
     lambda a, w: _torch_depthwise(a, w, 1, (2, 2, 2, 2), 2), [IMAGES, _normal(3, 3, 4, 2)]),
    ("conv-transpose-same-stride-2", lambda a, w: cg.conv2d_transpose(a, w, None, 2, "SAME"),
     lambda a, w: _torch_conv_transpose(a, w, 2, (0, 1, 0, 1)), [_normal(2, 3, 4, 5), _normal(3, 3, 4, 5)]),
    ("conv-transpose-same-odd-output", lambda a, w: cg.conv2d_transpose(a, w, [2, 5, 7, 4], 2, "SAME"),
     lambda a, w: _torch_conv_transpose(a, w, 2, (1, 1, 1, 1)), [_normal(2, 3, 4, 5), _normal(3, 3, 4, 5)]),
    ("conv-transpose-valid-dilation-2", lambda a, w: cg.conv2d_transpose(a, w, None, 2, "VALID", dilations=2),
     lambda a, w: _torch_conv_transpose(a, w, 2, (0, 0, 0, 0), 2), [_normal(2, 3, 4, 4), _normal(3, 3, 2, 4)]),
    ("conv1d-valid-stride-2", lambda a, w: cg.conv1d(a, w, 2, "VALID"),
     lambda a, w: F.conv1d(a.permute(0, 2, 1), w.permute(2, 1, 0), stride=2).permute(0, 2, 1),
     [_normal(2, 9, 3), _normal(3, 3, 4)]),
    ("resize-bilinear-down", lambda a: cg.resize(a, [2, 3]),
     _nhwc(lambda a: F.interpolate(a, (2, 3), mode="bilinear", align_corners=False)), [_normal(1, 5, 7, 2)]),
    ("resize-nearest-up", lambda a: cg.resize(a, [5, 7], method="nearest"),
     _nhwc(lambda a: F.interpolate(a, (5, 7), mode="nearest-exact")), [_normal(1, 3, 4, 2)]),
    # --------------------------------------------------- lookups with repeated indices: gradients add up
    ("gather-repeated", cg.gather, lambda p, i: p[i.long()], [_normal(5, 3), _ints(1, 1, 4, 1, 0)]),
    ("gather-repeated-axis-1", lambda p, i: cg.gather(p, i, axis=1), lambda p, i: p[:, i.long()],
     [_normal(5, 3), _ints(2, 2, 0, 2)]),
    ("gather-batch-dims", lambda p, i: cg.gather(p, i, axis=1, batch_dims=1),
     lambda p, i: torch.stack([p[b][i[b].long()] for b in range(2)]), [_normal(2, 4, 3), np.array([[1, 1, 3], [0, 0, 0]], np.int32)]),
    ("gather-nd-repeated", cg.gather_nd, lambda p, i: p[i[:, 0].long(), i[:, 1].long()],
     [_normal(5, 3), np.array([[1, 2], [1, 2], [4, 0]], np.int32)]),
    # A max or min shares a tie's gradient among the tensor's value and the updates equal to the result
    # (TF's TensorScatterMax; torch's scatter_reduce with include_self): rows 1 and 2 tie three and two ways.
    ("tensor-scatter-max-ties", cg.tensor_scatter_nd_max,
     lambda t, i, u: t.scatter_reduce(0, i.long().reshape(-1), u, "amax", include_self=True),
     [np.array([1.0, 2.0, 3.0, 4.0]), _ints([1], [1], [2], [0]), np.array([2.0, 2.0, 3.0, -1.0])]),
    ("tensor-scatter-min-rows", cg.tensor_scatter_nd_min,
     lambda t, i, u: t.scatter_reduce(0, i.long().expand(-1, 3), u, "amin", include_self=True),
     [np.array([[1.0, 2.0, 3.0], [0.0, 5.0, -1.0]]), _ints([1], [1], [0]), np.array([[0.0, 6.0, -1.0], [0.0, 4.0, -2.0], [2.0, 2.0, 2.0]])]),
    ("scatter-nd-repeated", lambda i, u: cg.scatter_nd(i, u, [5, 3]),
     lambda i, u: torch.zeros(5, 3, dtype=u.dtype).index_put((i[:, 0].long(),), u, accumulate=True),
     [np.array([[1], [1], [4]], np.int32), _normal(3, 3)]),
    # ------------------------------------------------------------------------------------ shape ops
    ("pad-reflect", lambda a: cg.pad(a, [[0, 0], [2, 1], [1, 3]], mode="REFLECT"),
     lambda a: F.pad(a, (1, 3, 2, 1), mode="reflect"), [_normal(2, 4, 5)]),
    ("pad-symmetric-whole-dim", lambda a: cg.pad(a, [[4, 4], [0, 0]], mode="SYMMETRIC"),
     lambda a: torch.cat([a.flip(0), a, a.flip(0)], 0), [_normal(4, 3)]),
    ("pad-constant-value", lambda a: cg.pad(a, [[1, 0], [0, 2]], constant_values=3.0),
     lambda a: F.pad(a, (0, 2, 1, 0), value=3.0), [_normal(5, 3)]),
    ("tile", lambda a: cg.tile(a, [2, 1, 3]), lambda a: a.repeat(2, 1, 3), [_normal(2, 1, 3)]),
    ("broadcast-to", lambda a: cg.broadcast_to(a, [2, 3, 4]), lambda a: a.expand(2, 3, 4), [_normal(3, 1)]),
    ("getitem-negative-stride", lambda a: a[::-2, 1:], lambda a: a.flip(0)[::2, 1:], [_normal(5, 3)]),
    ("concat-same-tensor-twice", lambda a, b: cg.concat([a, b, a], 1), lambda a, b: torch.cat([a, b, a], 1),
     [_normal(5, 3), _normal(5, 2)]),
    ("split-uneven", lambda a: cg.concat([s * (i + 1.0) for i, s in enumerate(cg.split(a, [1, 3, 1]))], 0),
     lambda a: torch.cat([s * (i + 1.0) for i, s in enumerate(torch.split(a, [1, 3, 1]))], 0), [_normal(5, 3)]),
    ("one-split-piece-used", lambda a: cg.split(a, [1, 3, 1])[1], lambda a: torch.split(a, [1, 3, 1])[1],
     [_normal(5, 3)]),
    ("unstack-stack-reversed", lambda a: cg.stack(cg.unstack(a, axis=1)[::-1]),
     lambda a: torch.stack(torch.unbind(a, 1)[::-1]), [_normal(5, 3)]),
    ("slice", lambda a: cg.slice(a, [1, 0], [3, 2]), lambda a: a[1:4, 0:2], [_normal(5, 3)]),
    ("transpose-reshape", lambda a: cg.reshape(cg.transpose(a, [2, 0, 1]), [4, -1]),
     lambda a: a.permute(2, 0, 1).reshape(4, -1), [_normal(2, 3, 4)]),
    ("depth-to-space", lambda a: cg.depth_to_space(a, 2), _nhwc(lambda a: F.pixel_shuffle(a, 2)), [_normal(1, 2, 3, 4)]),
    ("reverse", lambda a: cg.reverse(a, [0, 1]), lambda a: a.flip((0, 1)), [_normal(5, 3)]),
]  # fmt: skip


# float64 op by op (tight), float32 through fused loops (loose): each case compiles one fused loop, not two.
MODES = [pytest.param("float64", False, id="float64-unfused"), pytest.param("float32", True, id="float32-fused")]


@pytest.mark.parametrize(("dtype", "fuse"), MODES)
@pytest.mark.parametrize(("label", "build", "fn", "arrays"), CASES, ids=[c[0] for c in CASES])
def test_gradient_matches_torch(
    label: str, build: Any, fn: Any, arrays: list[np.ndarray], dtype: str, fuse: bool
) -> None:
    _check(label, build, fn, arrays, dtype, fuse)


def test_dense_labels_smoothed_are_torchs_label_smoothing() -> None:
    z, y = torch.from_numpy(LOGITS), torch.from_numpy(LABELS).long()
    torch.testing.assert_close(
        F.cross_entropy(z, torch.from_numpy(SMOOTHED)), F.cross_entropy(z, y, label_smoothing=0.1)
    )


# ---------------------------------------------------------------- second derivatives (a gradient penalty)
def _second_cellgraph(build: Any, arrays: list[np.ndarray], w: np.ndarray, vs: list[np.ndarray]) -> list[Any]:
    g = cg.Graph()
    with g.as_default():
        inputs = [cg.placeholder(a.shape, a.dtype.name, name=f"in{i}") for i, a in enumerate(arrays)]
        weights = cg.placeholder(w.shape, w.dtype.name, name="w")
        firsts = cg.gradients(cg.reduce_sum(build(*inputs) * weights), inputs)
        penalty = cg.reduce_sum(cg.stack([cg.reduce_sum(d * v) for d, v in zip(firsts, vs)]))
        seconds = cg.gradients(penalty, [*inputs, weights])
    fetches = [*firsts, *[d for d in seconds if d is not None]]
    values = iter(cg.Session(g, fuse=False).run(fetches, {**dict(zip(inputs, arrays)), weights: w}))
    return [next(values) for _ in firsts] + [None if d is None else next(values) for d in seconds]


def _second_torch(fn: Any, arrays: list[np.ndarray], w: np.ndarray, vs: list[np.ndarray]) -> list[Any]:
    leaves = [torch.tensor(a, requires_grad=True) for a in [*arrays, w]]
    firsts = torch.autograd.grad((fn(*leaves[:-1]) * leaves[-1]).sum(), leaves[:-1], create_graph=True)
    penalty = sum((d * torch.from_numpy(v)).sum() for d, v in zip(firsts, vs))
    seconds = torch.autograd.grad(penalty, leaves, allow_unused=True, materialize_grads=True)
    return [d.detach().numpy() for d in firsts] + [d.numpy() for d in seconds]


def _layer_norm_gamma(a: Any, gamma: Any) -> Any:
    return cg.layer_norm(a, gamma, cg.zeros_like(gamma), begin_axis=1)


def _batch_norm_gamma(axis: int) -> Callable[..., Any]:
    return lambda a, gamma: _batch_norm(axis)(a, gamma, cg.zeros_like(gamma))


SECOND_ORDER: list[Any] = [
    # At x = 0 elu and selu take their left branch's slope (alpha exp(0)), but their curvature there is 0:
    # TensorFlow's EluGradGrad and SeluGradGrad keep x < 0 strictly, as PyTorch does.
    ("elu-at-0", cg.elu, F.elu, [np.array([-1.0, 0.0, 1.0, -0.3])]),
    ("selu-at-0", cg.selu, F.selu, [np.array([-1.0, 0.0, 1.0, -0.3])]),
    # The normalizations' gradients were not differentiable: their second derivative came back None.
    ("layer-norm", _layer_norm_gamma, lambda a, g: F.layer_norm(a, (3, 4), g, None, 1e-5),
     [_normal(2, 3, 4), _normal(3, 4)]),
    ("batch-norm-training-nhwc", _batch_norm_gamma(-1), lambda a, g: _torch_batch_norm(True)(a, g, None),
     [_normal(2, 3, 2, 3), _normal(3)]),
    ("batch-norm-training-nchw", _batch_norm_gamma(1), lambda a, g: _torch_batch_norm(False)(a, g, None),
     [_normal(4, 3, 2), _normal(3)]),
    # A product's gradient at a zero moves with the other values: rows with one, two and three zeros.
    ("reduce-prod-through-zeros", lambda a: cg.reduce_prod(a, 1), lambda a: torch.prod(a, 1),
     [np.array([[1.0, 0.0, 3.0, 2.0], [0.0, 0.0, 2.0, 1.0], [0.0, 0.0, 0.0, 1.0], [1.0, 2.0, 3.0, 0.5]])]),
    ("reduce-prod-axes-keepdims", lambda a: cg.reduce_prod(a, [0, 2], keepdims=True),
     lambda a: a.prod(2, keepdim=True).prod(0, keepdim=True), [np.array([[[1.0, 0.0], [2.0, 3.0]], [[4.0, 5.0], [0.0, 0.0]]])]),
    ("relu-at-0", cg.relu, F.relu, [CORNERS]),
    ("gelu", cg.gelu, F.gelu, [_normal(5)]),
    ("softplus", cg.softplus, F.softplus, [_normal(5)]),
    ("log-softmax", cg.log_softmax, lambda a: torch.log_softmax(a, -1), [_normal(2, 4)]),
    ("max-pool-plateau", lambda a: cg.max_pool(a, 3, 1), _nhwc(lambda a: F.max_pool2d(a, 3, 1)), [PLATEAU]),
    ("sparse-xent", lambda z: cg.sparse_softmax_cross_entropy(z, LABELS), lambda z: F.cross_entropy(
        z, torch.from_numpy(LABELS).long(), reduction="none"), [LOGITS]),
]  # fmt: skip


@pytest.mark.parametrize(("label", "build", "fn", "arrays"), SECOND_ORDER, ids=[c[0] for c in SECOND_ORDER])
def test_second_derivative_matches_torch(label: str, build: Any, fn: Any, arrays: list[np.ndarray]) -> None:
    shape = fn(*[torch.from_numpy(a) for a in arrays]).shape
    rng = np.random.default_rng(len(label))
    w = rng.uniform(0.5, 1.5, shape)
    vs = [rng.uniform(0.5, 1.5, a.shape) for a in arrays]
    got, want = _second_cellgraph(build, arrays, w, vs), _second_torch(fn, arrays, w, vs)
    names = [f"d/d input {i}" for i in range(len(arrays))] + [f"d penalty/d input {i}" for i in range(len(arrays))]
    for name, mine, theirs in zip([*names, "d penalty/d w"], got, want):
        assert mine is not None or not np.any(theirs), f"{label}: cellgraph gives no {name}, torch gives {theirs}"
        mine = np.zeros_like(theirs) if mine is None else mine
        np.testing.assert_allclose(mine, theirs, rtol=1e-8, atol=1e-9, err_msg=f"{label}: {name}")


def test_a_product_scatter_has_no_gradient_and_says_so() -> None:
    g = cg.Graph()
    with g.as_default():
        t = cg.placeholder((4,), "float64", name="t")
        y = cg.dataflow.ops.array_index.tensor_scatter_reduce(
            t, _ints([1], [2]), cg.constant([2.0, 3.0], dtype="float64"), "mul"
        )
        with pytest.raises(cg.GradientError) as caught:
            cg.gradients(cg.reduce_sum(y), [t])
    assert str(caught.value) == (
        "tensor_scatter_reduce 'tensor_scatter': no gradient for reduction 'mul' (a product over repeated rows); "
        "write it with gather_nd and a product to differentiate it"
    )


# --------------------------------------------------------------- recurrent and attention layers, float32
def _layer_gradients(g: cg.Graph, loss: cg.Tensor, x: cg.Tensor, scope: str) -> dict[str, cg.Tensor | None]:
    """d loss / d x and d loss / d each variable under ``scope``, by their names in the scope."""
    variables = {n.name[len(scope) + 1 :]: n.output(0) for n in g.nodes if n.op == "Variable"}
    with g.as_default():
        grads = cg.gradients(loss, [x, *variables.values()])
    return dict(zip(["x", *variables], grads))


def test_lstm_gradients_match_torch() -> None:
    from ..test_layers_sequence import _load_lstm_from_torch

    batch, steps, features, units = 3, 4, 5, 6
    torch.manual_seed(1)
    reference = torch.nn.LSTM(features, units, batch_first=True)
    x_value = RNG.normal(size=(batch, steps, features)).astype(np.float32)
    w_out, w_c = RNG.uniform(0.5, 1.5, (batch, steps, units)), RNG.uniform(0.5, 1.5, (batch, units))
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, steps, features), name="x")
        outputs, (_, c) = cg.layers.lstm(x, units, name="rnn")
        loss = cg.reduce_sum(outputs * w_out.astype(np.float32)) + cg.reduce_sum(c * w_c.astype(np.float32))
    grads = _layer_gradients(g, loss, x, "rnn")
    sess = cg.Session(g)
    _load_lstm_from_torch(sess, g, reference, "rnn")
    got = dict(zip(grads, sess.run(list(grads.values()), {x: x_value})))
    xt = torch.tensor(x_value, requires_grad=True)
    out_t, (_, c_t) = reference(xt)
    loss_t = (out_t * torch.from_numpy(w_out).float()).sum() + (c_t[0] * torch.from_numpy(w_c).float()).sum()
    params = [xt, reference.weight_ih_l0, reference.weight_hh_l0, reference.bias_ih_l0]
    dx, dw_ih, dw_hh, db = (d.numpy() for d in torch.autograd.grad(loss_t, params))
    # torch's two biases are one here (their sum), so their gradients are the same one.
    want = {"x": dx, "kernel": dw_ih.T, "recurrent_kernel": dw_hh.T, "bias": db}
    for name, expected in want.items():
        np.testing.assert_allclose(got[name], expected, rtol=1e-4, atol=1e-5, err_msg=f"lstm: d loss / d {name}")


def test_multi_head_attention_gradients_match_torch() -> None:
    from ..test_layers_sequence import _load_attention_from_torch

    batch, steps, d, heads = 2, 4, 6, 2
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(d, heads, batch_first=True)
    x_value = RNG.normal(size=(batch, steps, d)).astype(np.float32)
    causal = np.tril(np.ones((steps, steps), bool))
    weights = RNG.uniform(0.5, 1.5, (batch, steps, d)).astype(np.float32)
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, steps, d), name="x")
        y = cg.layers.multi_head_attention(x, num_heads=heads, mask=cg.constant(causal[None, None]), name="attention")
        loss = cg.reduce_sum(y * weights)
    grads = _layer_gradients(g, loss, x, "attention")
    sess = cg.Session(g)
    _load_attention_from_torch(sess, g, mha, d, "attention")
    got = dict(zip(grads, sess.run(list(grads.values()), {x: x_value})))
    xt = torch.tensor(x_value, requires_grad=True)
    out, _ = mha(xt, xt, xt, attn_mask=torch.from_numpy(~causal), need_weights=False)
    params = [xt, mha.in_proj_weight, mha.in_proj_bias, mha.out_proj.weight, mha.out_proj.bias]
    dx, dw_in, db_in, dw_out, db_out = (
        t.numpy() for t in torch.autograd.grad((out * torch.from_numpy(weights)).sum(), params)
    )
    want = {"x": dx, "output/kernel": dw_out.T, "output/bias": db_out}
    for i, part in enumerate(("query", "key", "value")):
        want[f"{part}/kernel"], want[f"{part}/bias"] = dw_in[i * d : (i + 1) * d].T, db_in[i * d : (i + 1) * d]
    assert sorted(want) == sorted(got)
    for name, expected in want.items():
        np.testing.assert_allclose(got[name], expected, rtol=1e-4, atol=1e-5, err_msg=f"attention: d loss / d {name}")


def test_a_second_derivative_through_cumprod_is_refused_not_dropped() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((3,), "float64", name="x")
        (dx,) = cg.gradients(cg.reduce_sum(cg.cumprod(x)), [x])
        with pytest.raises(cg.GradientError) as caught:
            cg.gradients(cg.reduce_sum(dx * dx) + cg.reduce_sum(x), [x])
    assert str(caught.value) == (
        "cumprod_grad 'gradients/cumprod_grad': no second derivative of cumprod (the gradient of its gradient); "
        "PyTorch's torch.cumprod has one"
    )
