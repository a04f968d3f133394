"""The conveniences over the ops (``cg.losses``, ``cg.layers``, ``cg.init``, ``cg.metrics``) against NumPy.

Every expected value is computed here, from the formula the docstring states,
in float64 NumPy: never by the code under test.
"""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest

import cellgraph as cg

RNG = np.random.default_rng(1234)


# ---------------------------------------------------------------------- losses
def test_mean_squared_error_and_its_gradients() -> None:
    p_data = RNG.normal(size=(4, 3)).astype(np.float32)
    t_data = RNG.normal(size=(4, 3)).astype(np.float32)
    g = cg.Graph()
    with g.as_default():
        p = cg.placeholder((None, 3), name="p")
        t = cg.placeholder((None, 3), name="t")
        loss = cg.losses.mean_squared_error(p, t)
        d_p, d_t = cg.gradients(loss, [p, t])
    value, got_p, got_t = cg.Session(g).run([loss, d_p, d_t], {p: p_data, t: t_data})
    diff = p_data.astype(np.float64) - t_data
    assert loss.name == "loss:0" and value.shape == () and value.dtype == np.float32
    assert float(value) == pytest.approx(np.sum(diff**2) / diff.size, rel=1e-6)
    # d/dp mean((p - t)^2) = 2 (p - t) / n; d/dt is its negative.
    np.testing.assert_allclose(got_p, 2 * diff / diff.size, rtol=1e-6)
    np.testing.assert_allclose(got_t, -2 * diff / diff.size, rtol=1e-6)


def test_mean_squared_error_of_equal_tensors_is_zero() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.constant(RNG.normal(size=(5,)).astype(np.float32))
        loss = cg.losses.mean_squared_error(x, x, name="mse")
    assert loss.name == "mse:0" and float(cg.Session(g).run(loss)) == 0.0


# ---------------------------------------------------------------------- layers.avg_pool2d
def windows_mean(x: np.ndarray, size: int, stride: int) -> np.ndarray:
    """VALID average pooling of NHWC ``x``, one window at a time."""
    n, h, w, c = x.shape
    out = np.zeros((n, (h - size) // stride + 1, (w - size) // stride + 1, c))
    for i in range(out.shape[1]):
        for j in range(out.shape[2]):
            out[:, i, j, :] = x[:, i * stride : i * stride + size, j * stride : j * stride + size, :].mean(axis=(1, 2))
    return out


@pytest.mark.parametrize(("size", "strides"), [(2, None), (3, 1), (2, 3)])
def test_avg_pool2d_is_the_mean_of_each_window(size: int, strides: int | None) -> None:
    x_data = RNG.normal(size=(2, 7, 6, 3)).astype(np.float32)
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 7, 6, 3), name="x")
        y = cg.layers.avg_pool2d(x, size, strides)
        (dx,) = cg.gradients(cg.reduce_sum(y), [x])
    got, got_dx = cg.Session(g).run([y, dx], {x: x_data})
    stride = strides or size  # strides default to the pool size
    want = windows_mean(x_data.astype(np.float64), size, stride)
    assert y.shape == (None, *want.shape[1:]) and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # d sum(y) / d x: each window gives each of its pixels 1 / size^2.
    covered = np.zeros(x_data.shape)
    for i in range(want.shape[1]):
        for j in range(want.shape[2]):
            covered[:, i * stride : i * stride + size, j * stride : j * stride + size, :] += 1.0 / size**2
    np.testing.assert_allclose(got_dx, covered, rtol=1e-6)


def test_avg_pool2d_same_padding_averages_only_real_pixels() -> None:
    x_data = np.arange(9, dtype=np.float32).reshape(1, 3, 3, 1)
    g = cg.Graph()
    with g.as_default():
        y = cg.layers.avg_pool2d(cg.constant(x_data), 2, padding="SAME", name="pool")
    got = cg.Session(g).run(y)[0, :, :, 0]
    # 3x3 in 2x2 windows, stride 2: out 2x2; the edge windows hold 2 or 1 real pixels.
    x = x_data[0, :, :, 0].astype(np.float64)
    want = [[x[0:2, 0:2].mean(), x[0:2, 2].mean()], [x[2, 0:2].mean(), x[2, 2]]]
    assert y.name == "pool:0"
    np.testing.assert_allclose(got, want, rtol=1e-6)


# ---------------------------------------------------------------------- layers.dropout
def dropout_draws(seed: int, shape: tuple[int, ...], runs: int) -> list[np.ndarray]:
    """The uniform draws of ``runs`` runs of a dropout op seeded with ``seed`` (as ``cg.dropout`` documents)."""
    rng = np.random.default_rng(seed)
    return [rng.random(shape, dtype=np.float32) for _ in range(runs)]


def expected_dropout(x: np.ndarray, u: np.ndarray, rate: float) -> tuple[np.ndarray, np.ndarray]:
    """(output, mask): keep where the draw is at least ``rate``, scaled by 1 / (1 - rate)."""
    mask = np.where(u >= rate, 1.0 / (1.0 - rate), 0.0)
    return x * mask, mask


def test_dropout_layer_with_a_seed_draws_a_new_mask_each_run() -> None:
    rate, shape = 0.3, (4, 5)
    x_data = RNG.normal(size=shape).astype(np.float32)
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder(shape, name="x")
        y = cg.layers.dropout(x, rate, seed=42)
        (dx,) = cg.gradients(cg.reduce_sum(y), [x])
    sess = cg.Session(g)
    runs = [sess.run([y, dx], {x: x_data}) for _ in range(3)]
    for (got, got_dx), u in zip(runs, dropout_draws(42, shape, 3)):
        want, mask = expected_dropout(x_data.astype(np.float64), u, rate)
        np.testing.assert_allclose(got, want, rtol=1e-6)
        np.testing.assert_allclose(got_dx, mask, rtol=1e-6)  # the gradient goes through the same mask
    assert not np.array_equal(runs[0][0], runs[1][0])


def test_a_run_with_other_fetches_goes_on_with_the_sessions_masks() -> None:
    # Each plan (each fetch list) had a generator of its own: run(y), run(y), then run([y, s]) replayed the first
    # mask, and a loop alternating run(train) with run([train, loss]) trained on repeated masks.
    rate, shape = 0.5, (4, 6)
    x_data = np.ones(shape, np.float32)
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder(shape, name="x")
        y = cg.layers.dropout(x, rate, seed=7)
        s = cg.reduce_sum(y)
    sess = cg.Session(g)
    first, second = sess.run(y, {x: x_data}), sess.run(y, {x: x_data})
    third, total = sess.run([y, s], {x: x_data})
    draws = dropout_draws(7, shape, 3)
    for got, u in zip((first, second, third), draws):
        np.testing.assert_allclose(got, expected_dropout(x_data.astype(np.float64), u, rate)[0], rtol=1e-6)
    assert total == pytest.approx(float(third.sum()))
    again = cg.Session(g)  # a new session starts the sequence again
    np.testing.assert_array_equal(again.run([y, s], {x: x_data})[0], first)


def test_dropout_layer_is_seeded_by_its_name_like_cg_dropout() -> None:
    """Without a seed, layers.dropout and cg.dropout both seed by the node's full name (as variables do)."""
    rate, shape = 0.5, (64,)
    x_data = np.ones(shape, np.float32)

    def build(dropout: object) -> tuple[cg.Graph, list[cg.Tensor]]:
        g = cg.Graph()
        with g.as_default():
            x = cg.constant(x_data, name="x")
            with cg.name_scope("block"):
                outputs = [dropout(x, rate), dropout(x, rate)]  # type: ignore[operator]
        return g, outputs

    g, (first, second) = build(cg.layers.dropout)
    assert (first.name, second.name) == ("block/dropout:0", "block/dropout_1:0")
    got = cg.Session(g).run([first, second])
    for value, name in zip(got, ("block/dropout", "block/dropout_1")):
        [u] = dropout_draws(zlib.crc32(name.encode()), shape, 1)
        np.testing.assert_array_equal(value, expected_dropout(x_data, u, rate)[0].astype(np.float32))
    assert not np.array_equal(got[0], got[1])  # two layers drop different elements
    # The same model, built again, draws the same masks; so does cg.dropout under the same names.
    for again in (build(cg.layers.dropout), build(cg.dropout)):
        for a, b in zip(cg.Session(again[0]).run(again[1]), got):
            np.testing.assert_array_equal(a, b)


# ---------------------------------------------------------------------- init
def fans(shape: tuple[int, ...]) -> tuple[int, int]:
    """(fan_in, fan_out) by hand: (in, out) for dense, (h, w, in, out) for conv kernels."""
    if len(shape) == 2:
        return shape[0], shape[1]
    h, w, c_in, c_out = shape
    return h * w * c_in, h * w * c_out


def test_constant_initializers() -> None:
    for init in (cg.init.zeros, cg.init.Zeros()):
        got = init((2, 3), "float64")
        assert got.dtype == np.float64 and got.shape == (2, 3) and not got.any()
    for init in (cg.init.ones, cg.init.Ones()):
        got = init((3,), "int32", seed=7)  # a seed changes nothing
        np.testing.assert_array_equal(got, [1, 1, 1])
        assert got.dtype == np.int32
    assert cg.init.ones((), "float32") == np.float32(1.0)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_normal_initializers(dtype: str) -> None:
    assert cg.init.normal == cg.init.Normal(mean=0.0, stddev=0.05)  # the documented defaults
    shape = (3, 4)
    z = np.random.default_rng(5).standard_normal(shape)
    for init, mean, stddev in ((cg.init.normal, 0.0, 0.05), (cg.init.Normal(mean=2.0, stddev=0.5), 2.0, 0.5)):
        got = init(shape, dtype, seed=5)
        assert got.dtype == np.dtype(dtype) and got.shape == shape
        np.testing.assert_allclose(got, mean + stddev * z, rtol=1e-6)
        np.testing.assert_array_equal(got, init(shape, dtype, seed=5))  # the same seed, the same values
        assert not np.array_equal(got, init(shape, dtype, seed=6))


@pytest.mark.parametrize("shape", [(6, 10), (3, 3, 2, 4)])
def test_glorot_uniform_and_he_normal_scale_by_the_fans(shape: tuple[int, ...]) -> None:
    fan_in, fan_out = fans(shape)
    u = np.random.default_rng(9).random(shape)
    limit = math.sqrt(6.0 / (fan_in + fan_out))
    for init in (cg.init.glorot_uniform, cg.init.GlorotUniform()):
        np.testing.assert_allclose(init(shape, "float64", seed=9), -limit + 2 * limit * u, rtol=1e-12)
    z = np.random.default_rng(9).standard_normal(shape)
    for init in (cg.init.he_normal, cg.init.HeNormal()):
        got = init(shape, "float32", seed=9)
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, math.sqrt(2.0 / fan_in) * z, rtol=1e-6)


def test_a_variable_seeds_its_initializer_by_its_full_name() -> None:
    g = cg.Graph()
    with g.as_default():
        with cg.name_scope("layer"):
            w = cg.variable(cg.init.normal, shape=(2, 2), name="w")
        b = cg.variable(cg.init.ones, shape=(2,), name="b")
        s = cg.variable(cg.init.normal, shape=(2, 2), name="s", seed=3)
    values = cg.Session(g).variable_values()
    z = np.random.default_rng(zlib.crc32(b"layer/w")).standard_normal((2, 2))
    np.testing.assert_allclose(values[w.node.name], 0.05 * z, rtol=1e-6)
    np.testing.assert_array_equal(values[b.node.name], [1.0, 1.0])
    np.testing.assert_allclose(values[s.node.name], 0.05 * np.random.default_rng(3).standard_normal((2, 2)), rtol=1e-6)


# ---------------------------------------------------------------------- metrics.accuracy
@pytest.mark.parametrize("labels_dtype", ["int32", "int64"])
def test_accuracy_is_the_fraction_of_rows_whose_largest_logit_is_the_label(labels_dtype: str) -> None:
    logits_data = RNG.normal(size=(50, 7)).astype(np.float32)
    labels_data = RNG.integers(0, 7, 50).astype(labels_dtype)
    labels_data[:20] = logits_data[:20].argmax(axis=1)  # some hits for sure
    g = cg.Graph()
    with g.as_default():
        logits = cg.placeholder((None, 7), name="logits")
        labels = cg.placeholder((None,), labels_dtype, name="labels")
        acc = cg.metrics.accuracy(logits, labels)
    got = cg.Session(g).run(acc, {logits: logits_data, labels: labels_data})
    hits = sum(int(np.argmax(row) == label) for row, label in zip(logits_data.tolist(), labels_data.tolist()))
    assert acc.name == "accuracy:0" and got.dtype == np.float32
    assert float(got) == pytest.approx(hits / 50, rel=1e-6)


def test_accuracy_counts_a_tie_for_its_first_class() -> None:
    g = cg.Graph()
    with g.as_default():
        logits = cg.constant([[1.0, 1.0, 0.0], [0.0, 2.0, 2.0], [3.0, 3.0, 3.0], [0.0, 0.0, 0.0]])
        acc_first = cg.metrics.accuracy(logits, cg.constant([0, 1, 0, 0], dtype="int32"), name="first")
        acc_later = cg.metrics.accuracy(logits, cg.constant([1, 2, 2, 1], dtype="int32"), name="later")
    first, later = cg.Session(g).run([acc_first, acc_later])
    assert (float(first), float(later)) == (1.0, 0.0)


def test_accuracy_reads_a_column_of_labels_as_one_label_per_row() -> None:
    """(batch, 1) labels, as a Keras user feeds them: compared as they stood, (batch,) predictions against a
    (batch, 1) column broadcast to a (batch, batch) table, and its mean (5/9 here) was returned as the accuracy."""
    g = cg.Graph()
    with g.as_default():
        logits = cg.placeholder((None, 2), name="logits")
        column = cg.placeholder((None, 1), "int64", name="column")
        acc = cg.metrics.accuracy(logits, column)
    got = cg.Session(g).run(acc, {logits: np.eye(2, dtype=np.float32)[[1, 0, 1]], column: [[1], [0], [1]]})
    assert float(got) == 1.0


def test_accuracy_refuses_labels_fed_transposed() -> None:
    """(time, batch) labels for (batch, time) predictions, batch != time, are of their size: reshaped, each label
    was compared with another step's prediction (0.5 here, not 1.0) without a word."""
    g = cg.Graph()
    with g.as_default():
        logits = cg.placeholder((None, None, 2), name="logits")
        labels = cg.placeholder((None, None), "int32", name="labels")
        acc = cg.metrics.accuracy(logits, labels, name="acc")
        column = cg.placeholder((None, None), "int32", name="column")
        by_column = cg.metrics.accuracy(cg.placeholder((None, 2), name="scores"), column, name="by_column")
    sess = cg.Session(g)
    classes = np.array([[1, 0, 0], [1, 1, 0]], np.int32)  # batch 2, time 3
    scores = np.eye(2, dtype=np.float32)[classes]
    assert float(sess.run(acc, {logits: scores, labels: classes})) == 1.0
    with pytest.raises(cg.ExecutionError) as err:
        sess.run(acc, {logits: scores, labels: classes.T})
    assert "ReshapeLike 'acc_labels'" in str(err.value)
    assert "'labels:0' has shape (3, 2) but must have the shape of 'argmax" in str(err.value)
    assert str(err.value).endswith(":0', (2, 3)")
    # A column of labels is still read as one per row; a wider one fails at its squeeze.
    assert float(sess.run(by_column, {"scores:0": scores[0], column: classes[0][:, None]})) == 1.0
    with pytest.raises(cg.ExecutionError, match="Squeeze 'by_column_label_column'"):
        sess.run(by_column, {"scores:0": scores[0], column: np.zeros((3, 2), np.int32)})


def test_accuracy_refuses_labels_that_are_not_one_per_row() -> None:
    g = cg.Graph()
    with g.as_default():
        logits = cg.constant(np.zeros((4, 2), np.float32))
        for labels in (np.zeros(3, np.int32), np.zeros((4, 2), np.int32)):
            with pytest.raises(cg.ShapeError) as err:
                cg.metrics.accuracy(logits, cg.constant(labels))
            assert str(err.value) == (
                f"accuracy 'accuracy': labels have shape {labels.shape} but logits (4, 2) need one class index per "
                "row: shape (4,) (or (4, 1))"
            )
        fed = cg.placeholder((None,), "int32", name="fed")
        acc = cg.metrics.accuracy(cg.placeholder((None, 2), name="scores"), fed, name="acc")
    # One label fed for three rows broadcast against all three before; now the run fails, naming the node.
    with pytest.raises(
        cg.ExecutionError,
        match=r"ReshapeLike 'acc_labels'.*'fed:0' has shape \(1,\) but must have the shape of 'argmax.*:0', \(3,\)",
    ):
        cg.Session(g).run(acc, {"scores:0": np.zeros((3, 2), np.float32), fed: [1]})


def test_a_misspelled_name_is_answered_with_the_nearest_ones() -> None:
    with pytest.raises(AttributeError) as err:
        cg.reduce_men  # noqa: B018
    assert str(err.value) == (
        "module 'cellgraph' has no attribute 'reduce_men'; did you mean 'reduce_mean' or 'reduce_min' or 'reduce_sum'?"
    )
    with pytest.raises(AttributeError) as err:
        cg.trian  # noqa: B018
    assert "did you mean 'train'" in str(err.value)  # the names Dask brings are offered too
    with pytest.raises(AttributeError) as err:
        cg.zzzzqq  # noqa: B018
    assert str(err.value) == "module 'cellgraph' has no attribute 'zzzzqq'"


def test_tab_completion_offers_the_lazy_names_and_hides_the_modules_own_imports() -> None:
    # cg.<Tab> is dir(cg): cg.train and cg.Cluster were missing (imported with Dask at first use), and difflib,
    # Callable and annotations were offered as if they were cellgraph's.
    names = dir(cg)
    assert {"train", "Cluster", "ClusterError", "Job", "reduce_mean", "layers", "__version__"} <= set(names)
    assert not {"difflib", "Callable", "annotations"} & set(names)
    assert names == sorted(names)
    # The submodules a user tabs into offer what they export, not np, math or the op modules they import.
    for module in (cg.optim, cg.nn, cg.init, cg.metrics, cg.onnx, cg.layers, cg.losses, cg.placement):
        assert dir(module) == sorted(module.__all__), module.__name__
    assert "np" not in dir(cg.init) and "reductions" not in dir(cg.metrics) and "Adam" in dir(cg.optim)


def test_ipythons_completer_offers_cg_train_before_it_is_imported() -> None:
    import subprocess
    import sys

    # A fresh process: nothing has imported cellgraph.cluster yet (this process's tests have).
    code = (
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "from IPython.core.completer import provisionalcompleter\n"
        "shell = InteractiveShell.instance()\n"
        "shell.run_cell('import cellgraph as cg')\n"
        "with provisionalcompleter():\n"
        "    print(sorted(c.text for c in shell.Completer.completions('cg.tr', 5)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "['train', 'transpose']"
