"""``cg.layers.lstm`` and ``cg.layers.gru`` with variable lengths (``lengths=``, ``mask=``) against PyTorch's
``nn.LSTM``/``nn.GRU`` over ``pack_padded_sequence``, in float64 (within 1e-10) and float32, trained a few steps;
the GRU's layout; masks with holes; and every refusal's words."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import cellgraph as cg
from tests.oracle import NO_TORCH

from .dataflow.errors_helpers import ph, raises

B, T, F, U = 5, 6, 4, 3
TOL = {"float64": {"rtol": 1e-10, "atol": 1e-12}, "float32": {"rtol": 1e-4, "atol": 1e-5}}
GRU_ORDER = [1, 0, 2]  # torch's gate blocks (reset, update, candidate) in Keras's order (update, reset, candidate)


def _torch():  # type: ignore[no-untyped-def]
    return pytest.importorskip("torch", reason=NO_TORCH)


def _lengths(seed: int) -> np.ndarray:
    """Random lengths in [1, T] with a length-1 and a full-length sequence among them."""
    lengths = np.random.default_rng(seed).integers(1, T + 1, B)
    lengths[seed % B], lengths[(seed + 1) % B] = 1, T
    return lengths.astype(np.int32)


def _padded(seed: int, lengths: np.ndarray, dtype: str, pad: float = np.nan) -> np.ndarray:
    """Inputs with ``pad`` (NaN by default) at every padded step: it must reach neither output nor gradient."""
    x = np.random.default_rng(seed + 100).normal(size=(B, T, F)).astype(dtype)
    x[np.arange(T)[None, :] >= lengths[:, None]] = pad
    return x


def _blocks(a: Any, order: list[int]) -> Any:
    """``a``'s first axis as blocks of U rows, reordered."""
    return np.concatenate([a[k * U : (k + 1) * U] for k in order])


def _torch_weights(kind: str, values: dict[str, np.ndarray], scope: str) -> dict[str, np.ndarray]:
    """cellgraph's variables in torch's layout (LSTM: its whole bias as bias_ih, bias_hh zero)."""
    kernel, recurrent, bias = (values[f"{scope}/{v}"] for v in ("kernel", "recurrent_kernel", "bias"))
    if kind == "lstm":
        return {"weight_ih_l0": kernel.T, "weight_hh_l0": recurrent.T, "bias_ih_l0": bias, "bias_hh_l0": 0 * bias}
    return {
        "weight_ih_l0": _blocks(kernel.T, GRU_ORDER),
        "weight_hh_l0": _blocks(recurrent.T, GRU_ORDER),
        "bias_ih_l0": _blocks(bias[0], GRU_ORDER),
        "bias_hh_l0": _blocks(bias[1], GRU_ORDER),
    }


def _torch_module(torch: Any, kind: str, dtype: str, values: dict[str, np.ndarray], scope: str = "rnn") -> Any:
    module = (torch.nn.LSTM if kind == "lstm" else torch.nn.GRU)(F, U, batch_first=True)
    module = module.double() if dtype == "float64" else module
    module.load_state_dict(
        {k: torch.tensor(np.ascontiguousarray(v)) for k, v in _torch_weights(kind, values, scope).items()}
    )
    if kind == "lstm":  # cellgraph's one bias is torch's two summed: train it as bias_ih alone
        module.bias_hh_l0.requires_grad_(False)
    return module


def _torch_run(torch: Any, module: Any, x: Any, lengths: np.ndarray) -> tuple[Any, list[Any]]:
    """Outputs padded with zeros and the final states, through pack_padded_sequence as a PyTorch user runs it."""
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    packed = pack_padded_sequence(x, torch.tensor(lengths, dtype=torch.int64), batch_first=True, enforce_sorted=False)
    out, state = module(packed)
    out, _ = pad_packed_sequence(out, batch_first=True, total_length=T)
    return out, [s[0] for s in (state if isinstance(state, tuple) else (state,))]


def _build(kind: str, dtype: str, form: str, scope: str = "rnn") -> tuple[cg.Graph, dict[str, Any]]:
    """The layer fed by x and ``form`` ('lengths', 'mask' or 'both'), with a loss reading outputs and states."""
    rng = np.random.default_rng(3)
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, T, F), dtype, name="x")
        n = cg.placeholder((None,), "int32", name="lengths")
        m = cg.placeholder((None, T), "bool", name="mask")
        given = {"lengths": {"lengths": n}, "mask": {"mask": m}, "both": {"lengths": n, "mask": m}}[form]
        layer = cg.layers.lstm if kind == "lstm" else cg.layers.gru
        outputs, state = layer(x, U, name=scope, **given)  # type: ignore[operator]
        states = list(state) if kind == "lstm" else [state]
        weights = [rng.normal(size=(T, U))] + [rng.normal(size=(U,)) for _ in states]
        loss = cg.reduce_sum(outputs * cg.constant(weights[0], dtype))
        for s, w in zip(states, weights[1:]):
            loss = loss + cg.reduce_sum(s * cg.constant(w, dtype))
    t = {"x": x, "lengths": n, "mask": m, "outputs": outputs, "states": states, "loss": loss, "weights": weights}
    return g, t


def _feeds(t: dict[str, Any], x: np.ndarray, lengths: np.ndarray) -> dict[cg.Tensor, np.ndarray]:
    return {t["x"]: x, t["lengths"]: lengths, t["mask"]: np.arange(T)[None, :] < lengths[:, None]}


# ------------------------------------------------------------------ forward and training against torch
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("seed", [0, 1])
def test_lengths_match_torchs_packed_sequences_forward_and_after_training(kind: str, dtype: str, seed: int) -> None:
    torch = _torch()
    lengths = _lengths(seed)
    x_value = _padded(seed, lengths, dtype)
    g, t = _build(kind, dtype, "lengths")
    with g.as_default():
        train = cg.optim.SGD(0.3).minimize(t["loss"])
        variables = sorted((n for n in g.nodes if n.op == "Variable"), key=lambda n: n.name)
        grads = cg.gradients(t["loss"], [t["x"]] + [v.output(0) for v in variables])
    sess = cg.Session(g)
    module = _torch_module(torch, kind, dtype, sess.variable_values())
    out_w, *state_w = (torch.tensor(w.astype(dtype)) for w in t["weights"])
    opt = torch.optim.SGD([p for p in module.parameters() if p.requires_grad], lr=0.3)
    feeds = _feeds(t, x_value, lengths)
    tol = TOL[dtype]
    for step in range(3):  # forward at each step, then one update of both
        xt = torch.tensor(x_value, requires_grad=True)
        out, states = _torch_run(torch, module, xt, lengths)
        loss = (out * out_w).sum() + sum((s * w).sum() for s, w in zip(states, state_w))
        got = sess.run([t["outputs"], *t["states"], t["loss"], *grads], feeds)
        np.testing.assert_allclose(got[0], out.detach().numpy(), **tol, err_msg=f"outputs at step {step}")
        for i, s in enumerate(states):
            np.testing.assert_allclose(got[1 + i], s.detach().numpy(), **tol, err_msg=f"state {i} at step {step}")
        np.testing.assert_allclose(got[1 + len(states)], loss.item(), **tol)
        opt.zero_grad()
        loss.backward()
        d_x = got[2 + len(states)]
        # Padded steps have no influence: their gradient is exactly zero, as torch's (they are NaN here).
        np.testing.assert_allclose(d_x, xt.grad.numpy(), **tol, err_msg=f"d/dx at step {step}")
        want = _torch_weights(kind, {n.name: g_v for n, g_v in zip(variables, got[3 + len(states) :])}, "rnn")
        for name, grad in want.items():
            if name != "bias_hh_l0" or kind == "gru":
                np.testing.assert_allclose(grad, getattr(module, name).grad.numpy(), **tol, err_msg=name)
        opt.step()
        sess.run(train, feeds)
    assert np.all(np.isfinite(sess.run(t["outputs"], feeds)))


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_the_mask_form_and_both_forms_equal_the_lengths_form(kind: str) -> None:
    lengths = _lengths(2)
    x_value = _padded(2, lengths, "float64", pad=1e3)
    results = []
    start: dict[str, np.ndarray] = {}
    for form in ("lengths", "mask", "both"):
        g, t = _build(kind, "float64", form)
        sess = cg.Session(g)
        for name, value in start.items():  # the first form's weights for every form
            sess.variables.load(g.node(name), value)
        start = sess.variable_values()
        with g.as_default():
            d_x = cg.gradients(t["loss"], [t["x"]])[0]
        results.append(sess.run([t["outputs"], *t["states"], d_x], _feeds(t, x_value, lengths)))
    for other in results[1:]:
        for a, b in zip(results[0], other):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_a_mask_with_holes_carries_the_state_over_them(kind: str) -> None:
    # Keras's masks need not be a prefix: the state skips each masked step. Torch, run on each sequence's
    # valid steps alone, is the reference; outputs at masked steps are zeros.
    torch = _torch()
    keep = np.random.default_rng(4).random((B, T)) < 0.6
    keep[0], keep[1] = False, True  # no valid step at all (the zero state), and every step
    x_value = np.random.default_rng(5).normal(size=(B, T, F))
    g, t = _build(kind, "float64", "mask")
    sess = cg.Session(g)
    got = sess.run([t["outputs"], *t["states"]], {t["x"]: x_value, t["mask"]: keep})
    module = _torch_module(torch, kind, "float64", sess.variable_values())
    for b in range(B):
        want_out = np.zeros((T, U))
        want_states = [np.zeros(U) for _ in got[1:]]
        if keep[b].any():
            out, state = module(torch.tensor(x_value[b][keep[b]])[None])
            want_out[keep[b]] = out[0].detach().numpy()
            want_states = [s[0, 0].detach().numpy() for s in (state if kind == "lstm" else (state,))]
        np.testing.assert_allclose(got[0][b], want_out, **TOL["float64"])
        for s, w in zip(got[1:], want_states):
            np.testing.assert_allclose(s[b], w, **TOL["float64"])


def test_a_zero_length_keeps_the_initial_state_and_outputs_zeros() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 3, 2), "float64", name="x")
        h0 = cg.placeholder((None, 4), "float64", name="h0")
        outputs, h = cg.layers.gru(x, 4, initial_state=h0, lengths=cg.constant(np.array([0, 3])))
    h0_value = np.random.default_rng(6).normal(size=(2, 4))
    got_out, got_h = cg.Session(g).run([outputs, h], {x: np.ones((2, 3, 2)), h0: h0_value})
    np.testing.assert_array_equal(got_h[0], h0_value[0])
    np.testing.assert_array_equal(got_out[0], 0.0)
    assert np.all(got_out[1] != 0) and np.array_equal(got_h[1], got_out[1, 2])


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_without_lengths_or_mask_the_layer_builds_no_masking_nodes(kind: str) -> None:
    # A model saved or exported before lengths existed is the same graph: nothing is added for a full batch.
    g = cg.Graph()
    with g.as_default():
        getattr(cg.layers, kind)(cg.placeholder((None, 4, 3), name="x"), 5)
    assert not {"Where", "Gather", "Less", "LogicalAnd"} & {n.op for n in g.nodes}


# ------------------------------------------------------------------ gru without lengths
@pytest.mark.parametrize("given_state", [False, True], ids=["zero-state", "initial-state"])
def test_gru_matches_torch(given_state: bool) -> None:
    torch = _torch()
    rng = np.random.default_rng(7)
    x_value = rng.normal(size=(B, T, F)).astype(np.float32)
    h0 = rng.normal(size=(B, U)).astype(np.float32)
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, T, F), name="x")
        outputs, h = cg.layers.gru(x, U, initial_state=cg.constant(h0) if given_state else None, name="rnn")
    sess = cg.Session(g)
    # Torch's own random weights and biases into cellgraph (the biases start at zero in cellgraph).
    reference = torch.nn.GRU(F, U, batch_first=True)
    w = {k: v.detach().numpy() for k, v in reference.state_dict().items()}
    back = [1, 0, 2]  # Keras's order from torch's: the same swap
    sess.variables.load(g.node("rnn/kernel"), _blocks(w["weight_ih_l0"], back).T.copy())
    sess.variables.load(g.node("rnn/recurrent_kernel"), _blocks(w["weight_hh_l0"], back).T.copy())
    sess.variables.load(g.node("rnn/bias"), np.stack([_blocks(w[f"bias_{p}_l0"], back) for p in ("ih", "hh")]))
    got_out, got_h = sess.run([outputs, h], {x: x_value})
    want_out, want_h = reference(torch.from_numpy(x_value), torch.from_numpy(h0)[None] if given_state else None)
    np.testing.assert_allclose(got_out, want_out.detach().numpy(), **TOL["float32"])
    np.testing.assert_allclose(got_h, want_h[0].detach().numpy(), **TOL["float32"])


def test_gru_variables_are_laid_out_as_keras_reset_after_gru() -> None:
    g = cg.Graph()
    with g.as_default():
        cg.layers.gru(cg.placeholder((None, 8, 3), name="x"), 4)
    shapes = {n.name: n.output(0).shape for n in g.nodes if n.op == "Variable"}
    assert shapes == {"gru/kernel": (3, 12), "gru/recurrent_kernel": (4, 12), "gru/bias": (2, 12)}
    np.testing.assert_array_equal(cg.Session(g).run(g.node("gru/bias").output(0)), np.zeros((2, 12)))


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_gru_and_lstm_with_lengths_compute_in_the_policys_half_dtype(policy: str) -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, T, F), name="x")
        n = cg.placeholder((None,), "int32", name="lengths")
        with cg.layers.policy(policy):
            seq, h = cg.layers.gru(x, U, lengths=n)
            _, (h2, c2) = cg.layers.lstm(seq, U, lengths=n)
    half = policy.split("_")[1]
    assert (seq.dtype, h.dtype, h2.dtype, c2.dtype) == (half,) * 4
    assert {n.output(0).dtype for n in g.nodes if n.op == "Variable"} == {"float32"}
    lengths = _lengths(3)
    out, last = cg.Session(g).run([seq, h], {x: _padded(3, lengths, "float32"), n: lengths})
    assert np.all(np.isfinite(out.astype(np.float32))) and np.all(out[np.arange(T)[None] >= lengths[:, None]] == 0)
    np.testing.assert_array_equal(last, out[np.arange(B), lengths - 1])


# ------------------------------------------------------------------ refusals
@pytest.mark.parametrize("layer", ["lstm", "gru"])
def test_lengths_and_mask_errors_name_the_layer(layer: str) -> None:
    build = getattr(cg.layers, layer)
    g = cg.Graph()
    with g.as_default():
        x = ph(None, 5, 3, name="x")
        with raises(cg.DTypeError, f"{layer} layer 'rnn': lengths must be an int32 or int64 tensor of shape (batch,), "
                    "got float32 (None,)"):  # fmt: skip
            build(x, 4, lengths=ph(None, name="flen"), name="rnn")
        with raises(cg.DTypeError, "lengths must be an int32 or int64 tensor of shape (batch,), got [5, 5]"):
            build(x, 4, lengths=[5, 5])
        with raises(cg.ShapeError, f"{layer} layer '{layer}': lengths must have shape (batch,) = (None,) for input "
                    "(None, 5, 3), got (None, 5)"):  # fmt: skip
            build(x, 4, lengths=ph(None, 5, dtype="int32", name="len2"))
        with raises(cg.ShapeError, "lengths must have shape (batch,) = (2,) for input (2, 5, 3), got (3,)"):
            build(ph(2, 5, 3, name="x2"), 4, lengths=ph(3, dtype="int64", name="len3"))
        with raises(cg.DTypeError, f"{layer} layer '{layer}': mask must be a bool tensor of shape (batch, time), "
                    "got int32 (None, 5)"):  # fmt: skip
            build(x, 4, mask=ph(None, 5, dtype="int32", name="imask"))
        with raises(cg.ShapeError, f"{layer} layer '{layer}': mask must have shape (batch, time) = (None, 5) for "
                    "input (None, 5, 3), got (None, 6)"):  # fmt: skip
            build(x, 4, mask=ph(None, 6, dtype="bool", name="long"))
        with raises(cg.ShapeError, "mask must have shape (batch, time) = (None, 5) for input (None, 5, 3), got (5,)"):
            build(x, 4, mask=ph(5, dtype="bool", name="flat"))
        with raises(cg.ShapeError, f"{layer} layer '{layer}': lengths [0, 6] must each be in [0, 5] for input "
                    "(None, 5, 3)"):  # fmt: skip
            build(x, 4, lengths=cg.constant(np.array([0, 6], np.int32), name="consts"))
    assert [n.op for n in g.nodes if n.op != "Placeholder"] == ["Const"]


def test_a_fed_length_outside_the_sequence_fails_when_run_naming_the_layer() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 4, 2), name="x")
        n = cg.placeholder((None,), "int32", name="lengths")
        _, h = cg.layers.gru(x, 3, lengths=n, name="encoder")
    sess = cg.Session(g)
    sess.run(h, {x: np.ones((2, 4, 2), np.float32), n: [4, 0]})
    for bad in ([5, 1], [-1, 2]):
        with raises(cg.ExecutionError, "Gather 'encoder/lengths_in_0_to_4"):
            sess.run(h, {x: np.ones((2, 4, 2), np.float32), n: bad})


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_lengths_a_mask_or_a_state_fed_for_one_sequence_of_two_fail_the_run_naming_them(direction: str) -> None:
    """Fed for a batch of 1, each was broadcast over both sequences without a word (PyTorch refuses them)."""
    width = 3 * (2 if direction == "bidirectional" else 1)
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 4, 2), "float64", name="x")
        n = cg.placeholder((None,), "int32", name="lengths")
        m = cg.placeholder((None, 4), "bool", name="mask")
        h0, c0 = (cg.placeholder((None, width), "float64", name=w) for w in ("h0", "c0"))
        lstm, _ = cg.layers.lstm(x, 3, lengths=n, initial_state=(h0, c0), direction=direction, name="encoder")
        gru, _ = cg.layers.gru(x, 3, mask=m, initial_state=h0, direction=direction, name="decoder")
    sess = cg.Session(g)
    good = {
        x: np.ones((2, 4, 2)),
        n: [4, 2],
        m: np.ones((2, 4), bool),
        h0: np.zeros((2, width)),
        c0: np.ones((2, width)),
    }
    assert [a.shape for a in sess.run([lstm, gru], good)] == [(2, 4, width)] * 2
    for fed, node, size in (
        (n, "encoder/lengths_need_one_per_sequence", "has shape (1,) but must have the shape of"),
        # Checked per direction: a bidirectional state is two of 3 units.
        (c0, "encoder/initial_state1_needs_one_row_per_sequence", "has shape (1, 3) but must have the shape of"),
    ):
        with pytest.raises(cg.ExecutionError) as info:
            sess.run(lstm, {**good, fed: good[fed][:1]})
        assert f"ReshapeLike '{node}'" in str(info.value) and size in str(info.value)
    with pytest.raises(cg.ExecutionError) as info:
        sess.run(gru, {**good, m: good[m][:1]})
    assert "ReshapeLike 'decoder/mask_needs_one_row_per_sequence'" in str(info.value)
    assert "'mask:0' has shape (1, 4) but must have the shape of 'decoder/reduce_sum:0', (2, 4)" in str(info.value)
    with raises(cg.ExecutionError, "decoder/initial_state0_needs_one_row_per_sequence'"):
        sess.run(gru, {**good, h0: good[h0][:1]})
    assert [a.shape for a in sess.run([lstm, gru], good)] == [(2, 4, width)] * 2  # the layers still run


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_a_mask_fed_transposed_fails_the_run_naming_both_shapes(direction: str) -> None:
    """A (batch, time) mask of unknown dims fed as (time, batch), batch != time, is of the same size: the
    size check let it through and the layer read it in the wrong order, returning other numbers silently."""
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 3, 2), "float64", name="x")
        m = cg.placeholder((None, None), "bool", name="mask")
        out, _ = cg.layers.gru(x, 4, mask=m, direction=direction, name="decoder")
    sess = cg.Session(g)
    mask = np.array([[True, True, False], [True, False, False]])  # batch 2, time 3
    assert sess.run(out, {x: np.ones((2, 3, 2)), m: mask}).shape[:2] == (2, 3)
    with pytest.raises(cg.ExecutionError) as info:
        sess.run(out, {x: np.ones((2, 3, 2)), m: mask.T})
    assert "ReshapeLike 'decoder/mask_needs_one_row_per_sequence'" in str(info.value)
    assert "'mask:0' has shape (3, 2) but must have the shape of 'decoder/reduce_sum:0', (2, 3)" in str(info.value)


def test_gru_errors_name_the_layer() -> None:
    g = cg.Graph()
    with g.as_default():
        x = ph(None, 5, 3, name="x")
        with raises(cg.ShapeError, "gru layer 'gru' needs an input of shape (batch, time, features) with time and "
                    "features known, got (None, None, 3)"):  # fmt: skip
            cg.layers.gru(ph(None, None, 3, name="ragged"), 4)
        with raises(cg.ShapeError, "gru layer 'rnn': units must be a positive int, got 0"):
            cg.layers.gru(x, 0, name="rnn")
        with raises(cg.ShapeError, "gru layer 'gru' needs at least one time step, got (None, 0, 3)"):
            cg.layers.gru(ph(None, 0, 3, name="empty"), 4)
        with raises(cg.ShapeError, "gru layer 'gru': initial state h0 must be float32 (batch, 4), got float32 "
                    "(None, 5)"):  # fmt: skip
            cg.layers.gru(x, 4, initial_state=ph(None, 5, name="h0"))
    assert all(n.op == "Placeholder" for n in g.nodes)
