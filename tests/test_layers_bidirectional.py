"""``cg.layers.lstm`` and ``cg.layers.gru`` with ``direction="reverse"`` and ``"bidirectional"`` against PyTorch's
``nn.LSTM``/``nn.GRU(bidirectional=True)`` with the weights copied in: outputs, final states and the gradients of
the input and of every variable, over ragged batches through ``pack_padded_sequence`` (the reverse direction
starts at each sequence's last valid step), with and without an initial state; and the refusals' words."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import cellgraph as cg

from .test_layers_recurrent import GRU_ORDER, TOL, B, F, T, U, _blocks, _lengths, _padded, _torch

TORCH_SUFFIX = {"rnn": "", "rnn/backward": "_reverse"}


def _torch_names(kind: str, scope: str, suffix: str) -> dict[str, tuple[str, list[int] | None, bool]]:
    """cellgraph variable -> (torch parameter, GRU block order or None, transposed)."""
    order = GRU_ORDER if kind == "gru" else None
    return {
        f"{scope}/kernel": (f"weight_ih_l0{suffix}", order, True),
        f"{scope}/recurrent_kernel": (f"weight_hh_l0{suffix}", order, True),
    }


def _to_torch(kind: str, values: dict[str, np.ndarray], scope: str, suffix: str) -> dict[str, np.ndarray]:
    kernel, recurrent, bias = (values[f"{scope}/{v}"] for v in ("kernel", "recurrent_kernel", "bias"))
    if kind == "lstm":  # cellgraph's one bias is torch's two summed: bias_hh stays zero
        return {
            f"weight_ih_l0{suffix}": kernel.T,
            f"weight_hh_l0{suffix}": recurrent.T,
            f"bias_ih_l0{suffix}": bias,
            f"bias_hh_l0{suffix}": 0 * bias,
        }
    return {
        f"weight_ih_l0{suffix}": _blocks(kernel.T, GRU_ORDER),
        f"weight_hh_l0{suffix}": _blocks(recurrent.T, GRU_ORDER),
        f"bias_ih_l0{suffix}": _blocks(bias[0], GRU_ORDER),
        f"bias_hh_l0{suffix}": _blocks(bias[1], GRU_ORDER),
    }


def _from_torch_grad(kind: str, module: Any, name: str, suffix: str) -> np.ndarray:
    """The gradient of cellgraph's variable ``name`` (``.../kernel`` etc.) from the torch module's."""
    g = {k: v.grad.numpy() for k, v in module.named_parameters() if v.grad is not None}
    leaf = name.rsplit("/", 1)[1]
    if kind == "lstm":
        return {"kernel": g[f"weight_ih_l0{suffix}"].T, "recurrent_kernel": g[f"weight_hh_l0{suffix}"].T,
                "bias": g[f"bias_ih_l0{suffix}"]}[leaf]  # fmt: skip
    back = [GRU_ORDER.index(k) for k in range(3)]  # torch's blocks back in Keras's order (the swap is its own inverse)
    if leaf == "bias":
        return np.stack([_blocks(g[f"bias_ih_l0{suffix}"], back), _blocks(g[f"bias_hh_l0{suffix}"], back)])
    torch_name = "weight_ih_l0" if leaf == "kernel" else "weight_hh_l0"
    return _blocks(g[f"{torch_name}{suffix}"], back).T


def _build(kind: str, direction: str, with_state: bool) -> tuple[cg.Graph, dict[str, Any]]:
    rng = np.random.default_rng(5)
    width = U * (2 if direction == "bidirectional" else 1)
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, T, F), "float64", name="x")
        n = cg.placeholder((None,), "int32", name="lengths")
        count = (2 if kind == "lstm" else 1) if with_state else 0
        starts = [cg.placeholder((None, width), "float64", name=f"s{i}") for i in range(count)]
        start: Any = (tuple(starts) if kind == "lstm" else starts[0]) if with_state else None
        layer = cg.layers.lstm if kind == "lstm" else cg.layers.gru
        outputs, state = layer(x, U, initial_state=start, lengths=n, name="rnn", direction=direction)  # type: ignore[operator]
        states = list(state) if kind == "lstm" else [state]
        weights = [rng.normal(size=(T, width))] + [rng.normal(size=(width,)) for _ in states]
        loss = cg.reduce_sum(outputs * cg.constant(weights[0], "float64"))
        for s, w in zip(states, weights[1:]):
            loss = loss + cg.reduce_sum(s * cg.constant(w, "float64"))
    return g, {"x": x, "lengths": n, "starts": starts, "outputs": outputs, "states": states, "loss": loss,
               "weights": weights}  # fmt: skip


@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("direction", ["bidirectional", "reverse"])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_directions_match_torchs_bidirectional_packed_sequences_forward_and_gradients(
    kind: str, direction: str, with_state: bool
) -> None:
    torch = _torch()
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    lengths = _lengths(2)
    lengths[3] = 2  # a short sequence whose reverse pass must start at step 1, not at the padding's end
    x_value = _padded(2, lengths, "float64")  # NaN padding reaches neither output nor gradient
    g, t = _build(kind, direction, with_state)
    variables = sorted((nd for nd in g.nodes if nd.op == "Variable"), key=lambda nd: nd.name)
    with g.as_default():
        grads = cg.gradients(t["loss"], [t["x"], *t["starts"]] + [v.output(0) for v in variables])
    sess = cg.Session(g)
    values = sess.variable_values()
    rng = np.random.default_rng(9)
    for v in variables:  # nonzero biases: every bias's path is exercised
        values[v.name] = rng.normal(0, 0.5, values[v.name].shape)
        sess.variables.load(v, values[v.name])

    module = (torch.nn.LSTM if kind == "lstm" else torch.nn.GRU)(F, U, batch_first=True, bidirectional=True).double()
    # A reverse-only layer is torch's reverse half: its forward half keeps torch's own weights, unread.
    scopes = {"rnn": "", "rnn/backward": "_reverse"} if direction == "bidirectional" else {"rnn": "_reverse"}
    loaded = {k: v.detach().numpy() for k, v in module.state_dict().items()}
    for scope, suffix in scopes.items():
        loaded |= _to_torch(kind, values, scope, suffix)
    module.load_state_dict({k: torch.tensor(np.ascontiguousarray(v)) for k, v in loaded.items()})
    if kind == "lstm":
        for name, p in module.named_parameters():
            p.requires_grad_(not name.startswith("bias_hh"))

    start_values = [rng.normal(size=(B, U * len(scopes))) for _ in t["starts"]]
    feeds = {t["x"]: x_value, t["lengths"]: lengths} | dict(zip(t["starts"], start_values))
    got = sess.run([t["outputs"], *t["states"], *grads], feeds)
    out, states, (dx, *dstart_and_vars) = got[0], got[1 : 1 + len(t["states"])], got[1 + len(t["states"]) :]

    xt = torch.tensor(np.nan_to_num(x_value), requires_grad=True)  # torch never reads the padding either
    halves = [0, 1] if direction == "bidirectional" else [1]
    torch_starts = []
    for s in start_values:  # (batch, directions x U) -> torch's (2, batch, U), the unread half zeros
        full = np.zeros((2, B, U))
        for k, d in enumerate(halves):
            full[d] = s[:, k * U : (k + 1) * U]
        torch_starts.append(torch.tensor(full, requires_grad=True))
    start_arg = None if not with_state else (tuple(torch_starts) if kind == "lstm" else torch_starts[0])
    packed = pack_padded_sequence(xt, torch.tensor(lengths, dtype=torch.int64), batch_first=True, enforce_sorted=False)
    y, state = module(packed, start_arg)
    y, _ = pad_packed_sequence(y, batch_first=True, total_length=T)
    y = torch.cat([y[..., d * U : (d + 1) * U] for d in halves], dim=2)
    final = [torch.cat([s[d] for d in halves], dim=1) for s in (state if kind == "lstm" else (state,))]
    w_out, *w_states = (torch.tensor(w) for w in t["weights"])
    loss = (y * w_out).sum() + sum((s * w).sum() for s, w in zip(final, w_states))
    loss.backward()

    tol = TOL["float64"]
    np.testing.assert_allclose(out, y.detach().numpy(), **tol)
    for mine, theirs in zip(states, final, strict=True):
        np.testing.assert_allclose(mine, theirs.detach().numpy(), **tol)
    np.testing.assert_allclose(dx, xt.grad.numpy(), **tol)
    assert np.all(dx[np.arange(T)[None, :] >= lengths[:, None]] == 0)
    dstarts, dvars = dstart_and_vars[: len(t["starts"])], dstart_and_vars[len(t["starts"]) :]
    for mine, theirs in zip(dstarts, torch_starts):
        np.testing.assert_allclose(mine, np.concatenate([theirs.grad.numpy()[d] for d in halves], axis=1), **tol)
    for v, grad in zip(variables, dvars, strict=True):
        scope = v.name.rsplit("/", 1)[0]
        np.testing.assert_allclose(grad, _from_torch_grad(kind, module, v.name, scopes[scope]), **tol)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_a_bidirectional_layer_has_a_second_set_of_variables_in_its_backward_scope(kind: str) -> None:
    g = cg.Graph()
    with g.as_default():
        layer = cg.layers.lstm if kind == "lstm" else cg.layers.gru
        layer(cg.placeholder((None, T, F), name="x"), U, direction="bidirectional")  # type: ignore[operator]
    names = sorted(n.name for n in g.nodes if n.op == "Variable")
    leaves = ["bias", "kernel", "recurrent_kernel"]
    assert names == [f"{kind}/backward/{v}" for v in leaves] + [f"{kind}/{v}" for v in leaves]


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (
            lambda x: cg.layers.gru(x, U, direction="backwards"),
            "gru layer 'gru': direction must be one of 'forward', 'reverse', 'bidirectional', got 'backwards'",
        ),
        (
            lambda x: cg.layers.lstm(x, U, initial_state=(x[:, 0, :], x[:, 0, :]), direction="bidirectional"),
            f"lstm layer 'lstm': initial state h0 must be float32 (batch, {2 * U}), got float32 (None, {F})",
        ),
    ],
)
def test_direction_errors_name_the_layer(call: Any, words: str) -> None:
    g = cg.Graph()
    with g.as_default(), pytest.raises((ValueError, cg.ShapeError)) as info:
        call(cg.placeholder((None, T, F), name="x"))
    assert words in str(info.value)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_a_mask_with_holes_is_skipped_by_both_directions(kind: str) -> None:
    """A masked step is skipped, not run: each direction gives what it gives over the sequence with the masked
    steps taken out (as lengths), the outputs back at their steps and zeros at the masked ones."""
    rng = np.random.default_rng(6)
    mask = rng.random((B, T)) < 0.6
    mask[0], mask[1] = True, False  # a full row and an empty one
    x_value = rng.normal(size=(B, T, F))
    counts = mask.sum(1).astype(np.int32)
    compact = np.zeros_like(x_value)
    for b in range(B):
        compact[b, : counts[b]] = x_value[b, mask[b]]
    runs = []
    for given in ({"mask": mask}, {"lengths": counts}):
        g = cg.Graph()
        with g.as_default():
            x = cg.placeholder((None, T, F), "float64", name="x")
            feed = {k: cg.constant(v) for k, v in given.items()}
            layer = cg.layers.lstm if kind == "lstm" else cg.layers.gru
            outputs, state = layer(x, U, name="rnn", direction="bidirectional", **feed)  # type: ignore[operator]
        sess = cg.Session(g)
        for v in sorted((nd for nd in g.nodes if nd.op == "Variable"), key=lambda nd: nd.name):
            sess.variables.load(v, np.random.default_rng(len(v.name)).normal(0, 0.5, v.output(0).shape))
        states = list(state) if kind == "lstm" else [state]
        runs.append(sess.run([outputs, *states], {x: x_value if "mask" in given else compact}))
    (masked, *masked_states), (packed, *packed_states) = runs
    for b in range(B):
        np.testing.assert_allclose(masked[b, mask[b]], packed[b, : counts[b]], rtol=1e-12, atol=1e-12)
        assert np.all(masked[b, ~mask[b]] == 0)
    for m, p in zip(masked_states, packed_states, strict=True):
        np.testing.assert_allclose(m, p, rtol=1e-12, atol=1e-12)
