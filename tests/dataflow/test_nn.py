"""nn behaviour the op table cannot check: PyTorch agreement, dropout's masks, a whole network.

PyTorch is a reference here, never a dependency: those tests skip without it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import cellgraph as cg

rng = np.random.default_rng(0)


@pytest.fixture(autouse=True)
def graph() -> Iterator[cg.Graph]:
    g = cg.Graph()
    with g.as_default():
        yield g


@pytest.fixture(scope="module")
def torch() -> Any:
    return pytest.importorskip("torch")


def run(fetches: Any, feeds: dict[cg.Tensor, np.ndarray]) -> Any:
    return cg.Session().run(fetches, feeds)


def nchw(x: np.ndarray) -> Any:
    import torch

    return torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))


def nhwc(t: Any) -> np.ndarray:
    return t.detach().numpy().transpose(0, 2, 3, 1)


def same_pads(size: int, k: int, stride: int) -> tuple[int, int]:
    """TensorFlow's SAME padding (before, after), which PyTorch takes explicitly."""
    out = -(-size // stride)
    total = max((out - 1) * stride + k - size, 0)
    return total // 2, total - total // 2


# ------------------------------------------------------------ vs PyTorch
CONVS = [
    ((4, 8, 8, 3), (3, 3, 3, 5), (1, 1), "SAME"),
    ((4, 8, 8, 3), (3, 3, 3, 5), (2, 2), "SAME"),
    ((2, 7, 6, 4), (2, 3, 4, 3), (2, 1), "SAME"),
    ((2, 9, 9, 2), (5, 5, 2, 4), (1, 1), "VALID"),
    ((2, 9, 8, 2), (3, 3, 2, 4), (3, 2), "VALID"),
    ((64, 8, 8, 16), (3, 3, 16, 16), (1, 1), "SAME"),
    ((64, 8, 8, 8), (5, 5, 8, 8), (1, 1), "SAME"),
    ((64, 8, 8, 16), (1, 1, 16, 8), (1, 1), "SAME"),
]


@pytest.mark.parametrize(("x_shape", "f_shape", "strides", "padding"), CONVS)
def test_conv2d_and_its_gradients_match_torch(
    torch: Any, x_shape: tuple, f_shape: tuple, strides: tuple, padding: str
) -> None:
    F = torch.nn.functional
    x_val = rng.standard_normal(x_shape).astype(np.float32)
    f_val = rng.standard_normal(f_shape).astype(np.float32)
    x, f = cg.placeholder(x_shape, name="x"), cg.placeholder(f_shape, name="f")
    y = cg.conv2d(x, f, strides=strides, padding=padding)
    dy_val = rng.standard_normal([d for d in y.shape]).astype(np.float32)  # type: ignore[misc]
    dy = cg.placeholder(y.shape, name="dy")
    dx, df = cg.gradients(y, [x, f], dy)
    got_y, got_dx, got_df = run([y, dx, df], {x: x_val, f: f_val, dy: dy_val})

    xt = nchw(x_val).requires_grad_()
    ft = torch.from_numpy(f_val.transpose(3, 2, 0, 1).copy()).requires_grad_()
    pads = (0, 0, 0, 0)
    if padding == "SAME":
        (top, bottom), (left, right) = (same_pads(x_shape[i], f_shape[i - 1], strides[i - 1]) for i in (1, 2))
        pads = (left, right, top, bottom)
    yt = F.conv2d(F.pad(xt, pads), ft, stride=strides)
    yt.backward(nchw(dy_val))
    np.testing.assert_allclose(got_y, nhwc(yt), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got_dx, nhwc(xt.grad), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got_df, ft.grad.numpy().transpose(2, 3, 1, 0), rtol=1e-4, atol=1e-3)


POOLS = [
    ((4, 8, 8, 3), 2, 2, "VALID"),
    ((4, 8, 8, 3), 3, 1, "SAME"),
    ((4, 8, 8, 3), 3, 2, "SAME"),
    ((2, 7, 9, 2), 3, 2, "VALID"),
    ((64, 8, 8, 32), 2, 2, "VALID"),
]


def torch_pads(x_shape: tuple, k: int, s: int, padding: str) -> tuple[int, int, int, int]:
    """F.pad's (left, right, top, bottom) that reproduce TensorFlow's SAME padding."""
    if padding != "SAME":
        return (0, 0, 0, 0)
    (top, bottom), (left, right) = (same_pads(x_shape[i], k, s) for i in (1, 2))
    return (left, right, top, bottom)


@pytest.mark.parametrize(("x_shape", "k", "s", "padding"), POOLS)
def test_max_pool_and_its_gradient_match_torch(torch: Any, x_shape: tuple, k: int, s: int, padding: str) -> None:
    F = torch.nn.functional
    x_val = rng.standard_normal(x_shape).astype(np.float32)
    x = cg.placeholder(x_shape, name="x")
    y = cg.max_pool(x, k, s, padding)
    [dx] = cg.gradients(cg.reduce_sum(y * y), [x])
    got_y, got_dx = run([y, dx], {x: x_val})

    xt = nchw(x_val).requires_grad_()
    pads = torch_pads(x_shape, k, s, padding)
    yt = F.max_pool2d(F.pad(xt, pads, value=-np.inf), k, s)
    (yt * yt).sum().backward()
    np.testing.assert_array_equal(got_y, nhwc(yt))
    np.testing.assert_allclose(got_dx, nhwc(xt.grad), rtol=1e-6)


@pytest.mark.parametrize(("x_shape", "k", "s", "padding"), POOLS)
def test_avg_pool_and_its_gradient_match_torch(torch: Any, x_shape: tuple, k: int, s: int, padding: str) -> None:
    F = torch.nn.functional
    x_val = rng.standard_normal(x_shape).astype(np.float32)
    x = cg.placeholder(x_shape, name="x")
    y = cg.avg_pool(x, k, s, padding)
    [dx] = cg.gradients(cg.reduce_sum(y * y), [x])
    got_y, got_dx = run([y, dx], {x: x_val})

    # PyTorch has no SAME; a padded sum divided by a padded count of real pixels is TF's average.
    xt = nchw(x_val).requires_grad_()
    pads = torch_pads(x_shape, k, s, padding)
    total = F.avg_pool2d(F.pad(xt, pads), k, s, divisor_override=1)
    count = F.avg_pool2d(F.pad(torch.ones_like(xt[:1, :1]), pads), k, s, divisor_override=1)
    yt = total / count
    (yt * yt).sum().backward()
    np.testing.assert_allclose(got_y, nhwc(yt), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_dx, nhwc(xt.grad), rtol=1e-5, atol=1e-6)


def test_softmax_and_cross_entropy_match_torch(torch: Any) -> None:
    logits_val = (rng.standard_normal((6, 5)) * 4).astype(np.float32)
    labels_val = np.array([0, 4, 2, 2, 1, 3], np.int64)
    logits, labels = cg.placeholder((None, 5), name="logits"), cg.placeholder((None,), "int64", name="labels")
    loss = cg.reduce_mean(cg.sparse_softmax_cross_entropy(logits, labels))
    [dlogits] = cg.gradients(loss, [logits])
    got = run([cg.softmax(logits), cg.log_softmax(logits), loss, dlogits], {logits: logits_val, labels: labels_val})

    lt = torch.from_numpy(logits_val).requires_grad_()
    lt_loss = torch.nn.functional.cross_entropy(lt, torch.from_numpy(labels_val))
    lt_loss.backward()
    want = [torch.softmax(lt, -1), torch.log_softmax(lt, -1), lt_loss, lt.grad]
    for value, expected in zip(got, want):
        np.testing.assert_allclose(value, expected.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_a_small_inception_network_matches_torch_forward_and_backward(torch: Any) -> None:
    """Every nn op of a training step together: conv, bias, relu, pools, concat, dense, loss."""
    F = torch.nn.functional
    shapes = {
        "stem": (3, 3, 1, 8),
        "b1": (1, 1, 8, 4),
        "b3": (3, 3, 8, 4),
        "b5": (5, 5, 8, 4),
        "bp": (1, 1, 8, 4),
        "w": (64, 10),
    }
    values = {k: (rng.standard_normal(s) * 0.3).astype(np.float32) for k, s in shapes.items()}
    biases = {k: (rng.standard_normal(s[-1]) * 0.1).astype(np.float32) for k, s in shapes.items()}
    x_val = rng.standard_normal((16, 8, 8, 1)).astype(np.float32)
    y_val = rng.integers(0, 10, 16).astype(np.int32)

    x, y = cg.placeholder((None, 8, 8, 1), name="x"), cg.placeholder((None,), "int32", name="y")
    params = {k: cg.variable(v, name=k) for k, v in values.items()}
    bparams = {k: cg.variable(v, name=f"{k}_b") for k, v in biases.items()}

    def conv(t: cg.Tensor, k: str) -> cg.Tensor:
        return cg.relu(cg.bias_add(cg.conv2d(t, params[k]), bparams[k]))

    stem = conv(x, "stem")
    pooled = cg.max_pool(stem, 3, 1, "SAME")
    block = cg.concat([conv(stem, "b1"), conv(stem, "b3"), conv(stem, "b5"), conv(pooled, "bp")], axis=3)
    head = cg.reshape(cg.avg_pool(block, 2, 2), (-1, 4 * 4 * 16))
    logits = cg.bias_add(
        cg.reshape(cg.max_pool(cg.reshape(head, (-1, 4, 4, 16)), 2, 2), (-1, 64)) @ params["w"], bparams["w"]
    )
    loss = cg.reduce_mean(cg.sparse_softmax_cross_entropy(logits, y))
    names = sorted(params)
    grads = cg.gradients(loss, [params[k] for k in names] + [bparams[k] for k in names])
    got_loss, *got_grads = run([loss, *grads], {x: x_val, y: y_val})

    tp = {k: torch.from_numpy(v).requires_grad_() for k, v in values.items()}
    tb = {k: torch.from_numpy(v).requires_grad_() for k, v in biases.items()}

    def tconv(t: Any, k: str) -> Any:
        w = tp[k].permute(3, 2, 0, 1)
        return F.relu(F.conv2d(t, w, tb[k], padding="same"))

    ts = tconv(nchw(x_val), "stem")
    tpool = F.max_pool2d(F.pad(ts, (1, 1, 1, 1), value=-np.inf), 3, 1)
    tblock = torch.cat([tconv(ts, "b1"), tconv(ts, "b3"), tconv(ts, "b5"), tconv(tpool, "bp")], dim=1)
    thead = F.max_pool2d(F.avg_pool2d(tblock, 2, 2), 2, 2).permute(0, 2, 3, 1).reshape(-1, 64)
    tloss = F.cross_entropy(thead @ tp["w"] + tb["w"], torch.from_numpy(y_val.astype(np.int64)))
    tloss.backward()
    np.testing.assert_allclose(got_loss, tloss.item(), rtol=1e-5)
    for got, want in zip(got_grads, [tp[k].grad for k in names] + [tb[k].grad for k in names]):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------- dropout
def test_dropout_draws_a_new_mask_each_run_and_the_same_sequence_each_session() -> None:
    x = cg.placeholder((100, 50), name="x")
    y = cg.dropout(x, 0.3, seed=7)
    ones = np.ones((100, 50), np.float32)
    first = cg.Session()
    a, b = first.run(y, {x: ones}), first.run(y, {x: ones})
    assert not np.array_equal(a, b)
    again = cg.Session()
    np.testing.assert_array_equal(again.run(y, {x: ones}), a)
    np.testing.assert_array_equal(again.run(y, {x: ones}), b)


def test_dropout_keeps_about_one_minus_rate_and_scales_what_it_keeps() -> None:
    x = cg.placeholder((200, 100), name="x")
    y = cg.dropout(x, 0.25, seed=1)
    out = run(y, {x: np.ones((200, 100), np.float32)})
    kept = out != 0
    assert abs(kept.mean() - 0.75) < 0.01
    np.testing.assert_allclose(out[kept], 1 / 0.75, rtol=1e-6)


def test_dropout_gradient_goes_through_the_same_mask_as_the_forward_pass() -> None:
    x = cg.placeholder((30, 20), name="x")
    y = cg.dropout(x, 0.5, seed=2)
    [dx] = cg.gradients(cg.reduce_sum(y * 3.0), [x])
    mask = y.node.output(1)
    x_val = rng.uniform(1, 2, (30, 20)).astype(np.float32)
    sess = cg.Session()
    for _ in range(3):  # a new mask each run, and the gradient follows it
        y_val, dx_val, mask_val = sess.run([y, dx, mask], {x: x_val})
        np.testing.assert_allclose(y_val, x_val * mask_val, rtol=1e-6)
        np.testing.assert_allclose(dx_val, 3.0 * mask_val, rtol=1e-6)
        assert set(np.unique(mask_val)) == {0.0, 2.0}


def test_dropout_without_a_seed_is_seeded_by_its_name() -> None:
    def build() -> np.ndarray:
        g = cg.Graph()
        with g.as_default():
            x = cg.placeholder((10, 10), name="x")
            y = cg.dropout(x, 0.5, name="drop")
        return cg.Session(g).run(y, {x: np.ones((10, 10), np.float32)})

    np.testing.assert_array_equal(build(), build())
    a, b = cg.dropout(cg.placeholder((10,), name="x"), 0.5), cg.dropout(cg.placeholder((10,), name="z"), 0.5)
    assert a.node.attrs["seed"] != b.node.attrs["seed"]


def test_dropout_rate_zero_is_the_identity() -> None:
    x = cg.placeholder((4, 5), name="x")
    x_val = rng.standard_normal((4, 5)).astype(np.float32)
    np.testing.assert_array_equal(run(cg.dropout(x, 0.0), {x: x_val}), x_val)


# ----------------------------------------------------------------- edges
def test_softmax_of_huge_logits_stays_finite() -> None:
    x = cg.placeholder((2, 3), name="x")
    got = run([cg.softmax(x), cg.log_softmax(x)], {x: np.array([[1e30, 0, -1e30], [3e38, 3e38, 0]], np.float32)})
    assert all(np.isfinite(v).all() for v in got)
    np.testing.assert_allclose(got[0], np.array([[1, 0, 0], [0.5, 0.5, 0]]))


def test_ops_run_on_an_unknown_batch_of_any_size() -> None:
    x = cg.placeholder((None, 6, 6, 2), name="x")
    f = cg.constant(rng.standard_normal((3, 3, 2, 4)).astype(np.float32))
    y = cg.max_pool(cg.relu(cg.conv2d(x, f, strides=2)), 2, 1, "SAME")
    assert y.shape == (None, 3, 3, 4)
    sess = cg.Session()
    for n in (1, 5, 0):
        assert sess.run(y, {x: np.ones((n, 6, 6, 2), np.float32)}).shape == (n, 3, 3, 4)


def test_kernels_accept_non_contiguous_inputs() -> None:
    x = cg.placeholder((2, 5, 5, 3), name="x")
    f = cg.placeholder((3, 3, 3, 4), name="f")
    y = cg.conv2d(x, f)
    x_val = rng.standard_normal((3, 5, 4, 5)).astype(np.float32).transpose(0, 3, 1, 2)[:2, :, :, :3]
    f_val = rng.standard_normal((4, 3, 3, 3)).astype(np.float32).transpose(1, 2, 3, 0)
    node = y.node
    expected = node.opdef.reference(node.attrs, x_val, f_val)
    np.testing.assert_allclose(run(y, {x: x_val, f: f_val}), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(run(cg.relu(x), {x: x_val}), np.maximum(x_val, 0))


def test_nn_graphs_survive_a_graphdef_round_trip_and_run_the_same() -> None:
    from cellgraph.dataflow.graphdef import from_graphdef, to_graphdef

    x = cg.placeholder((None, 8, 8, 3), name="x")
    f = cg.variable(rng.standard_normal((3, 3, 3, 4)).astype(np.float32), name="f")
    y = cg.relu(cg.bias_add(cg.conv2d(x, f, strides=(1, 2, 2, 1)), [1.0, 2.0, 3.0, 4.0]))
    y = cg.dropout(cg.avg_pool(cg.max_pool(y, 3, 1, "SAME"), 2, 2), 0.5, seed=3)
    loss = cg.reduce_sum(cg.log_softmax(cg.reshape(y, (-1, 16))))
    [dx] = cg.gradients(loss, [x])
    x_val = rng.standard_normal((2, 8, 8, 3)).astype(np.float32)
    want = run([loss, dx], {x: x_val})

    g2 = from_graphdef(to_graphdef(x.graph))
    got = cg.Session(g2).run([g2.tensor(loss.name), g2.tensor(dx.name)], {g2.tensor(x.name): x_val})
    for value, expected in zip(got, want):
        np.testing.assert_allclose(value, expected, rtol=1e-6)
