"""``cg.resize`` against a per-pixel NumPy statement of TensorFlow 2's half-pixel
rule, its gradients by finite differences, empty batches and channels, and its
refusals' words. (PyTorch agrees too: tests/oracle/rows_cumulative.py.)"""

from __future__ import annotations

import math

import numpy as np
import pytest

import cellgraph as cg

RNG = np.random.default_rng(3)
SIZES = [((4, 5), (8, 10)), ((6, 7), (3, 4)), ((5, 5), (7, 3)), ((1, 3), (4, 2)), ((3, 3), (3, 3))]


def _pixelwise(x: np.ndarray, out: tuple[int, int], method: str) -> np.ndarray:
    """One output pixel at a time, from the documented coordinate rule."""
    n, h, w, c = x.shape
    y = np.zeros((n, *out, c))
    for i in range(out[0]):
        for j in range(out[1]):
            if method == "nearest":
                r = min(math.floor((i + 0.5) * h / out[0]), h - 1)
                s = min(math.floor((j + 0.5) * w / out[1]), w - 1)
                y[:, i, j] = x[:, r, s]
                continue
            u, v = max((i + 0.5) * h / out[0] - 0.5, 0.0), max((j + 0.5) * w / out[1] - 0.5, 0.0)
            r0, s0 = min(math.floor(u), h - 1), min(math.floor(v), w - 1)
            r1, s1 = min(r0 + 1, h - 1), min(s0 + 1, w - 1)
            a, b = u - r0, v - s0
            y[:, i, j] = (
                (1 - a) * (1 - b) * x[:, r0, s0] + (1 - a) * b * x[:, r0, s1]
                + a * (1 - b) * x[:, r1, s0] + a * b * x[:, r1, s1]
            )  # fmt: skip
    return y


def _run(data: np.ndarray, out: tuple[int, int], method: str, static: tuple | None = None) -> tuple:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder(static or data.shape, "float64", name="x")
        y = cg.resize(x, out, method)
    return g, x, y


@pytest.mark.parametrize("method", ["bilinear", "nearest"])
@pytest.mark.parametrize(("size", "out"), SIZES)
def test_resize_matches_the_pixelwise_rule(method: str, size: tuple, out: tuple) -> None:
    data = RNG.normal(size=(2, *size, 3))
    g, x, y = _run(data, out, method, static=(None, *size, 3))
    assert y.shape == (None, *out, 3)
    np.testing.assert_allclose(cg.Session(g).run(y, {x: data}), _pixelwise(data, out, method), atol=1e-12)


def test_rank3_images_and_float32() -> None:
    data = RNG.normal(size=(4, 5, 2)).astype(np.float32)
    g = cg.Graph()
    with g.as_default():
        y = cg.resize(cg.constant(data), (6, 3))
    got = cg.Session(g).run(y)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, _pixelwise(data[None].astype(np.float64), (6, 3), "bilinear")[0], rtol=1e-6)


@pytest.mark.parametrize("method", ["bilinear", "nearest"])
def test_resize_gradient_matches_finite_differences(method: str) -> None:
    data = RNG.normal(size=(2, 3, 4, 2))
    g, x, y = _run(data, (5, 3), method)
    weights = RNG.uniform(0.5, 1.5, size=(2, 5, 3, 2))
    with g.as_default():
        loss = cg.reduce_sum(y * cg.constant(weights, dtype="float64"))
        (dx,) = cg.gradients(loss, [x])
    sess = cg.Session(g)
    got = sess.run(dx, {x: data})
    numeric = np.zeros_like(data)
    for index in np.ndindex(*data.shape):
        up, down = data.copy(), data.copy()
        up[index] += 1e-6
        down[index] -= 1e-6
        numeric[index] = (sess.run(loss, {x: up}) - sess.run(loss, {x: down})) / 2e-6
    np.testing.assert_allclose(got, numeric, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("method", ["bilinear", "nearest"])
@pytest.mark.parametrize("shape", [(0, 3, 4, 2), (2, 3, 4, 0)])
def test_an_empty_batch_or_channel_axis_gives_an_empty_result(method: str, shape: tuple) -> None:
    g, x, y = _run(np.zeros(shape), (5, 2), method)
    got = cg.Session(g).run(y, {x: np.zeros(shape)})
    assert got.shape == (shape[0], 5, 2, shape[3])


@pytest.mark.parametrize(
    ("shape", "size", "method", "error", "words"),
    [
        ((1, 4, 4, 1), (2, 2), "bicubic", cg.ShapeError, "resize: method 'bicubic' is not one of bilinear, nearest"),
        ((1, 4, 4, 1), (2, 0), "bilinear", cg.ShapeError, "resize: size must be two ints >= 1 (height, width), got"),
        (
            (1, 4, 4, 1),
            (2, 2, 2),
            "nearest",
            cg.ShapeError,
            "size must be two ints >= 1 (height, width), got (2, 2, 2)",
        ),
        ((1, 4, 4, 1), (2.5, 2), "nearest", cg.ShapeError, "resize: size must be (height, width) ints, got (2.5, 2)"),
        ((4, 4), (2, 2), "nearest", cg.ShapeError, "expects images of rank 3 (HWC) or 4 (NHWC), got shape (4, 4)"),
        ((1, None, 4, 1), (2, 2), "bilinear", cg.ShapeError, "the height and width of (1, None, 4, 1) must be known"),
        (
            (1, 0, 4, 1),
            (2, 2),
            "bilinear",
            cg.ShapeError,
            "the height and width of (1, 0, 4, 1) must be known and >= 1",
        ),
    ],
)
def test_resize_refusals_name_what_is_wrong(shape: tuple, size: tuple, method: str, error: type, words: str) -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder(shape, name="x")
        before = len(g.nodes)
        with pytest.raises(error) as info:
            cg.resize(x, size, method)
    assert words in str(info.value)
    assert len(g.nodes) == before


def test_int_images_are_refused() -> None:
    g = cg.Graph()
    with g.as_default():
        with pytest.raises(cg.DTypeError, match="resize: expects float images, got int32"):
            cg.resize(cg.placeholder((1, 2, 2, 1), "int32", name="x"), (4, 4))
