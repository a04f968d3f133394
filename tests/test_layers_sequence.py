"""The sequence layers (embedding, multi_head_attention, lstm) against PyTorch with the same weights copied in;
their shapes, their gradients reaching every variable, and every error they raise."""

from __future__ import annotations

import math

import numpy as np
import pytest

import cellgraph as cg
from tests.oracle import NO_TORCH

from .dataflow.errors_helpers import ph, raises

RNG = np.random.default_rng(16)


def _torch():  # type: ignore[no-untyped-def]
    return pytest.importorskip("torch", reason=NO_TORCH)


def _variables(g: cg.Graph, scope: str) -> dict[str, cg.Node]:
    return {n.name[len(scope) + 1 :]: n for n in g.nodes if n.op == "Variable" and n.name.startswith(scope + "/")}


def _gradients_reach_every_variable(g: cg.Graph, loss: cg.Tensor, feeds: dict[cg.Tensor, np.ndarray]) -> None:
    variables = [n for n in g.nodes if n.op == "Variable" and n.attrs["trainable"]]
    with g.as_default():
        grads = cg.gradients(loss, [v.output(0) for v in variables])
    values = cg.Session(g).run(grads, feeds)
    for v, gv in zip(variables, values):
        assert gv is not None and gv.shape == v.output(0).shape, v.name
        assert np.all(np.isfinite(gv)) and np.abs(gv).sum() > 0, f"no gradient reaches {v.name}"


# ---------------------------------------------------------- dense per position
def test_dense_applies_one_kernel_at_every_position_of_a_sequence() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 5, 3), name="x")
        y = cg.layers.dense(x, 4, activation="gelu")
    sess = cg.Session(g)
    x_value = RNG.normal(size=(2, 5, 3)).astype(np.float32)
    kernel, bias = sess.run([g.node("dense/kernel").output(0), g.node("dense/bias").output(0)])
    z = x_value.astype(np.float64) @ kernel + bias
    gelu = 0.5 * z * (1 + np.vectorize(math.erf)(z / math.sqrt(2)))
    assert y.shape == (None, 5, 4)
    np.testing.assert_allclose(sess.run(y, {x: x_value}), gelu, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ embedding
def test_embedding_gathers_rows_of_its_table_and_its_gradient_counts_each_lookup() -> None:
    g = cg.Graph()
    with g.as_default():
        ids = cg.placeholder((None, 3), "int32", name="ids")
        vectors = cg.layers.embedding(ids, vocab_size=6, dim=4)
        loss = cg.reduce_sum(vectors)
        (d_table,) = cg.gradients(loss, [g.node("embedding/embeddings").output(0)])
    assert vectors.shape == (None, 3, 4)
    ids_value = np.array([[0, 5, 5], [2, 0, 5]], np.int32)
    sess = cg.Session(g)
    table = sess.run(g.node("embedding/embeddings").output(0))
    got, grad = sess.run([vectors, d_table], {ids: ids_value})
    np.testing.assert_array_equal(got, table[ids_value])
    # d(sum of the looked-up rows)/d(table): each row, once per lookup of it.
    counts = np.bincount(ids_value.ravel(), minlength=6).astype(np.float32)
    np.testing.assert_array_equal(grad, np.repeat(counts[:, None], 4, axis=1))


def test_embedding_errors_name_the_layer() -> None:
    g = cg.Graph()
    with g.as_default():
        with raises(cg.DTypeError, "embedding layer 'words' needs integer ids, got float32 (None, 3)"):
            cg.layers.embedding(ph(None, 3), 10, 4, name="words")
        ids = ph(None, 3, dtype="int32", name="ids")
        with raises(cg.ShapeError, "embedding layer 'embedding': vocab_size must be a positive int, got 0"):
            cg.layers.embedding(ids, 0, 4)
        with raises(cg.ShapeError, "embedding layer 'embedding': dim must be a positive int, got 2.5"):
            cg.layers.embedding(ids, 10, 2.5)  # type: ignore[arg-type]
    assert [n.op for n in g.nodes] == ["Placeholder", "Placeholder"]


# -------------------------------------------------------- multi_head_attention
def _load_attention_from_torch(sess: cg.Session, g: cg.Graph, mha: object, d: int, scope: str) -> None:
    weights = {k: v.detach().numpy() for k, v in mha.state_dict().items()}  # type: ignore[attr-defined]
    w_in, b_in = weights["in_proj_weight"], weights["in_proj_bias"]
    variables = _variables(g, scope)
    for i, part in enumerate(("query", "key", "value")):
        sess.variables.load(variables[f"{part}/kernel"], w_in[i * d : (i + 1) * d].T.copy())
        sess.variables.load(variables[f"{part}/bias"], b_in[i * d : (i + 1) * d].copy())
    sess.variables.load(variables["output/kernel"], weights["out_proj.weight"].T.copy())
    sess.variables.load(variables["output/bias"], weights["out_proj.bias"].copy())


@pytest.mark.parametrize("masked", [False, True], ids=["no-mask", "causal-mask"])
def test_multi_head_attention_matches_torch(masked: bool) -> None:
    torch = _torch()
    batch, t, d, heads = 3, 5, 8, 2
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(d, heads, batch_first=True)
    x_value = RNG.normal(size=(batch, t, d)).astype(np.float32)
    causal = np.tril(np.ones((t, t), bool))
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, t, d), name="x")
        mask = cg.constant(causal[None, None]) if masked else None
        y = cg.layers.multi_head_attention(x, num_heads=heads, mask=mask, name="attention")
    sess = cg.Session(g)
    _load_attention_from_torch(sess, g, mha, d, "attention")
    got = sess.run(y, {x: x_value})
    xt = torch.from_numpy(x_value)
    # PyTorch's attn_mask says which keys may NOT be attended to: the negation of ours.
    want, _ = mha(xt, xt, xt, attn_mask=torch.from_numpy(~causal) if masked else None, need_weights=False)
    assert got.shape == (batch, t, d)
    np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-4, atol=1e-5)


def test_multi_head_attention_cross_attention_and_key_dim_shape() -> None:
    g = cg.Graph()
    with g.as_default():
        q, kv = cg.placeholder((None, 4, 6), name="q"), cg.placeholder((None, 7, 10), name="kv")
        y = cg.layers.multi_head_attention(q, kv, num_heads=3, key_dim=5)
    variables = _variables(g, "multi_head_attention")
    assert variables["query/kernel"].output(0).shape == (6, 15)
    assert variables["key/kernel"].output(0).shape == (10, 15)
    assert variables["output/kernel"].output(0).shape == (15, 6)
    assert y.shape == (None, 4, 6)
    out = cg.Session(g).run(y, {q: RNG.normal(size=(2, 4, 6)), kv: RNG.normal(size=(2, 7, 10))})
    assert out.shape == (2, 4, 6)


def test_a_mask_hides_keys_exactly() -> None:
    # A query that may see only key 0 gets value 0's projection, whatever the other keys hold.
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 3, 4), name="x")
        only_first = np.zeros((3, 3), bool)
        only_first[:, 0] = True
        y = cg.layers.multi_head_attention(x, num_heads=2, mask=cg.constant(only_first))
    sess = cg.Session(g)
    a = RNG.normal(size=(1, 3, 4)).astype(np.float32)
    b = a.copy()
    b[:, 1:] = RNG.normal(size=(1, 2, 4))
    ya, yb = sess.run(y, {x: a}), sess.run(y, {x: b})
    np.testing.assert_allclose(ya, yb, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ya[0, 0], ya[0, 2], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("batch", [1, 2, 3], ids=["batch-1", "batch-equals-heads", "batch-3"])
def test_a_keras_shaped_mask_is_per_sequence_for_every_head(batch: int) -> None:
    # A (batch, t_q, t_k) mask, as Keras's attention_mask is: sequence b's mask hides keys for all of b's heads,
    # and for no other sequence. PyTorch takes the same mask per (sequence, head), negated, repeated per head.
    torch = _torch()
    t, d, heads = 4, 6, 2
    torch.manual_seed(1)
    mha = torch.nn.MultiheadAttention(d, heads, batch_first=True)
    x_value = RNG.normal(size=(batch, t, d)).astype(np.float32)
    mask_value = RNG.random((batch, t, t)) < 0.6
    mask_value[..., 0] = True  # every query may see some key
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, t, d), name="x")
        mask = cg.placeholder((None, t, t), "bool", name="mask")
        y = cg.layers.multi_head_attention(x, num_heads=heads, mask=mask, name="attention")
    sess = cg.Session(g)
    _load_attention_from_torch(sess, g, mha, d, "attention")
    got = sess.run(y, {x: x_value, mask: mask_value})
    xt = torch.from_numpy(x_value)
    per_head = torch.from_numpy(~mask_value).repeat_interleave(heads, dim=0)  # (batch * heads, t_q, t_k)
    want, _ = mha(xt, xt, xt, attn_mask=per_head, need_weights=False)
    np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-4, atol=1e-5)


def test_gradients_reach_every_attention_variable() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 5, 8), name="x")
        y = cg.layers.multi_head_attention(x, num_heads=4)
        loss = cg.reduce_sum(y * y)
    _gradients_reach_every_variable(g, loss, {x: RNG.normal(size=(2, 5, 8)).astype(np.float32)})


def test_multi_head_attention_errors_name_the_layer() -> None:
    g = cg.Graph()
    with g.as_default():
        x = ph(None, 5, 8, name="x")
        with raises(cg.ShapeError, "multi_head_attention layer 'mha' needs a query of shape (batch, time, features) "
                    "with time and features known, got (None, 8)"):  # fmt: skip
            cg.layers.multi_head_attention(ph(None, 8, name="flat"), name="mha")
        with raises(cg.DTypeError, "multi_head_attention layer 'multi_head_attention' needs a float value, got int32"):
            cg.layers.multi_head_attention(x, ph(None, 5, 8, dtype="int32", name="ints"))
        with raises(cg.ShapeError, "key and value need the same time steps, got key (None, 4, 8) and value "
                    "(None, 5, 8)"):  # fmt: skip
            cg.layers.multi_head_attention(x, x, ph(None, 4, 8, name="short"))
        with raises(cg.ShapeError, "num_heads must be a positive int, got 0"):
            cg.layers.multi_head_attention(x, num_heads=0)
        with raises(cg.ShapeError, "the query's 8 features do not split into 3 heads; give key_dim"):
            cg.layers.multi_head_attention(x, num_heads=3)
        with raises(cg.DTypeError, "mask must be a bool tensor, got float32 (5, 5)"):
            cg.layers.multi_head_attention(x, mask=ph(5, 5, name="fmask"))
        with raises(cg.ShapeError, "mask of shape (4, 5) does not fit the scores' (t_q, t_k) = (5, 5)"):
            cg.layers.multi_head_attention(x, mask=ph(4, 5, dtype="bool", name="bmask"))
        # A padding mask (batch, t_k) was read as (t_q, t_k): with t_q sequences in the batch, row b masked query b
        # of every sequence without a word.
        with raises(cg.ShapeError, "mask of shape (None, 5) would be read as (t_q, t_k) = (5, 5), one mask for every "
                    "sequence, but its first axis is unknown; give t_q = 5 there, or give a mask of each sequence's "
                    "keys (batch, t_k) as (batch, 1, t_k) = (None, 1, 5) (true where a key may be attended: "
                    "PyTorch's key_padding_mask negated)"):  # fmt: skip
            cg.layers.multi_head_attention(x, mask=ph(None, 5, dtype="bool", name="pmask"))
        with raises(cg.ShapeError, "mask of shape (None, 5, 4) does not fit the scores' (batch, t_q, t_k) = "
                    "(None, 5, 5)"):  # fmt: skip
            cg.layers.multi_head_attention(x, mask=ph(None, 5, 4, dtype="bool", name="kmask"))
        with raises(cg.ShapeError, "mask of shape (2, 3, 5, 5) does not fit the scores' (batch, num_heads, t_q, "
                    "t_k) = (None, 1, 5, 5)"):  # fmt: skip
            cg.layers.multi_head_attention(x, mask=ph(2, 3, 5, 5, dtype="bool", name="hmask"))
        with raises(cg.ShapeError, "mask of shape (1, 1, 1, 5, 5) has rank 5; give (batch, t_q, t_k) = "
                    "(None, 5, 5), (t_q, t_k), (t_k,), or a rank-4 mask"):  # fmt: skip
            cg.layers.multi_head_attention(x, mask=ph(1, 1, 1, 5, 5, dtype="bool", name="rmask"))
    assert all(n.op == "Placeholder" for n in g.nodes)


# ---------------------------------------------------------------------- lstm
def _load_lstm_from_torch(sess: cg.Session, g: cg.Graph, lstm: object, scope: str) -> None:
    w = {k: v.detach().numpy() for k, v in lstm.state_dict().items()}  # type: ignore[attr-defined]
    variables = _variables(g, scope)
    sess.variables.load(variables["kernel"], w["weight_ih_l0"].T.copy())
    sess.variables.load(variables["recurrent_kernel"], w["weight_hh_l0"].T.copy())
    sess.variables.load(variables["bias"], w["bias_ih_l0"] + w["bias_hh_l0"])


@pytest.mark.parametrize("given_state", [False, True], ids=["zero-state", "initial-state"])
def test_lstm_matches_torch(given_state: bool) -> None:
    torch = _torch()
    batch, t, features, units = 4, 6, 5, 7
    torch.manual_seed(1)
    reference = torch.nn.LSTM(features, units, batch_first=True)
    x_value = RNG.normal(size=(batch, t, features)).astype(np.float32)
    h0, c0 = (RNG.normal(size=(batch, units)).astype(np.float32) for _ in range(2))
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, t, features), name="x")
        state = (cg.constant(h0), cg.constant(c0)) if given_state else None
        outputs, (h, c) = cg.layers.lstm(x, units, initial_state=state, name="rnn")
    # The batch is known once a constant initial state fixes it.
    n = batch if given_state else None
    assert outputs.shape == (n, t, units) and h.shape == (n, units) and c.shape == (n, units)
    sess = cg.Session(g)
    _load_lstm_from_torch(sess, g, reference, "rnn")
    got_out, got_h, got_c = sess.run([outputs, h, c], {x: x_value})
    torch_state = (torch.from_numpy(h0)[None], torch.from_numpy(c0)[None]) if given_state else None
    want_out, (want_h, want_c) = reference(torch.from_numpy(x_value), torch_state)
    np.testing.assert_allclose(got_out, want_out.detach().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got_h, want_h[0].detach().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got_c, want_c[0].detach().numpy(), rtol=1e-4, atol=1e-5)


def test_lstm_shares_one_set_of_variables_across_steps_and_starts_the_forget_bias_at_one() -> None:
    g = cg.Graph()
    with g.as_default():
        cg.layers.lstm(cg.placeholder((None, 8, 3), name="x"), 4)
    variables = _variables(g, "lstm")
    assert sorted(variables) == ["bias", "kernel", "recurrent_kernel"]
    assert variables["kernel"].output(0).shape == (3, 16)
    assert variables["recurrent_kernel"].output(0).shape == (4, 16)
    bias = cg.Session(g).run(variables["bias"].output(0))
    np.testing.assert_array_equal(bias, np.repeat([0.0, 1.0, 0.0, 0.0], 4))


def test_lstm_gradients_reach_every_variable_through_the_unrolled_steps() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 5, 3), name="x")
        _, (h, _) = cg.layers.lstm(x, 4)
        loss = cg.reduce_sum(h)
        (d_x,) = cg.gradients(loss, [x])
    _gradients_reach_every_variable(g, loss, {x: RNG.normal(size=(2, 5, 3)).astype(np.float32)})
    # The final state depends on the first step's input: the gradient went back through every step.
    first = cg.Session(g).run(d_x, {x: RNG.normal(size=(2, 5, 3)).astype(np.float32)})[:, 0]
    assert np.abs(first).sum() > 0


def test_lstm_errors_name_the_layer() -> None:
    g = cg.Graph()
    with g.as_default():
        x = ph(None, 5, 3, name="x")
        with raises(cg.ShapeError, "lstm layer 'lstm' needs an input of shape (batch, time, features) with time and "
                    "features known, got (None, None, 3)"):  # fmt: skip
            cg.layers.lstm(ph(None, None, 3, name="ragged"), 4)
        with raises(cg.ShapeError, "lstm layer 'rnn': units must be a positive int, got -1"):
            cg.layers.lstm(x, -1, name="rnn")
        with raises(cg.ShapeError, "lstm layer 'lstm' needs at least one time step, got (None, 0, 3)"):
            cg.layers.lstm(ph(None, 0, 3, name="empty"), 4)
        h0 = ph(None, 4, name="h0")
        with raises(cg.ShapeError, "lstm layer 'lstm': initial state c0 must be float32 (batch, 4), got float32 "
                    "(None, 5)"):  # fmt: skip
            cg.layers.lstm(x, 4, initial_state=(h0, ph(None, 5, name="c0")))
    assert all(n.op == "Placeholder" for n in g.nodes)
