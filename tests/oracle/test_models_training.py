"""Whole models trained step by step against PyTorch: the loss and every parameter after each step.

The single ops, layers and optimizers have their own oracle tests; these train the models they make up, in
float64, from the same weights (cellgraph's, copied into torch's modules in torch's layout) on the same batches:

- an LSTM classifier: a table looked up by ids, two stacked ``cg.layers.lstm`` (the first one's whole sequence
  into the second, whose last state and per-token outputs are both read), a per-token loss that ignores padded
  positions, Adam after ``clip_by_global_norm``, against ``nn.LSTM``;
- a pre-norm transformer block: ``multi_head_attention`` under a causal and a padding mask, ``layer_norm``,
  residuals, a GELU feed-forward, AdamW on a warm-up/cosine schedule of the global step, against
  ``nn.MultiheadAttention``;
- a CNN with batch norm after two convolutions and a dense layer, overlapping max pooling with TensorFlow's SAME
  padding, average pooling, Nesterov momentum with an L2 penalty (torch's ``weight_decay``), then evaluated with
  its moving statistics, against ``nn.BatchNorm2d``/``1d``.

Adam's epsilon is TensorFlow's (see ``cg.optim.Adam``), so the torch side runs the same update written out
(``TFAdam`` of ``test_optimizers.py``); batch norm's ``momentum`` is Keras' (torch's is ``1 - momentum``) and
its moving variance moves by the biased batch variance (torch's ``running_var`` by the unbiased one).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from . import NO_TORCH

torch = pytest.importorskip("torch", reason=NO_TORCH)

import torch.nn.functional as F  # noqa: E402, N812

import cellgraph as cg  # noqa: E402

from .test_optimizers import TFAdam  # noqa: E402

STEPS = 12
TOL = {"rtol": 1e-10, "atol": 1e-13}


def _check(step: int, got: dict[str, np.ndarray], want: dict[str, Any], loss: float, want_loss: float) -> None:
    np.testing.assert_allclose(loss, want_loss, **TOL, err_msg=f"loss at step {step}")
    for name, tensor in want.items():
        np.testing.assert_allclose(got[name], tensor.detach().numpy(), **TOL, err_msg=f"{name} after step {step}")


# ------------------------------------------------------------------ LSTM
def test_stacked_lstm_with_clipped_adam_trains_as_torch() -> None:
    b, t, vocab, emb, units, classes, clip = 4, 5, 12, 6, 7, 3, 0.5
    rng = np.random.default_rng(0)
    g = cg.Graph()
    with g.as_default():
        ids = cg.placeholder((None, t), "int32", name="ids")
        y = cg.placeholder((None,), "int32", name="y")
        y_tokens = cg.placeholder((None, t), "int32", name="y_tokens")
        table = cg.variable(rng.normal(0, 0.5, (vocab, emb)), dtype="float64", name="table")
        seq, _ = cg.layers.lstm(cg.gather(table, ids), units, name="lstm1")
        seq2, (last, _) = cg.layers.lstm(seq, units, name="lstm2")
        logits = cg.layers.dense(cg.concat([last, cg.reduce_mean(seq2, axis=1)], axis=1), classes, name="out")
        loss = cg.losses.sparse_softmax_cross_entropy(logits, y) + cg.losses.sparse_softmax_cross_entropy(
            cg.layers.dense(seq2, classes, name="tok"), y_tokens, ignore_index=-100
        )
        opt = cg.optim.Adam(0.02)
        pairs = opt.compute_gradients(loss)
        clipped, norm = cg.optim.clip_by_global_norm([grad for grad, _ in pairs], clip)
        train = opt.apply_gradients(list(zip(clipped, [v for _, v in pairs])))
    sess = cg.Session(g)
    start = {k: torch.tensor(v) for k, v in sess.variable_values().items()}

    lstms = {
        n: torch.nn.LSTM(emb if n == "lstm1" else units, units, batch_first=True).double() for n in ("lstm1", "lstm2")
    }
    heads = {n: torch.nn.Linear(2 * units if n == "out" else units, classes).double() for n in ("out", "tok")}
    tab = torch.nn.Parameter(start["table"].clone())
    with torch.no_grad():
        for n, layer in lstms.items():  # Keras's kernels are torch's transposed; gates i, f, g(c), o in both
            layer.weight_ih_l0.copy_(start[f"{n}/kernel"].T)
            layer.weight_hh_l0.copy_(start[f"{n}/recurrent_kernel"].T)
            layer.bias_ih_l0.copy_(start[f"{n}/bias"])
            layer.bias_hh_l0.zero_().requires_grad_(False)  # cellgraph has one bias
        for n, head in heads.items():
            head.weight.copy_(start[f"{n}/kernel"].T)
            head.bias.copy_(start[f"{n}/bias"])
    params = {"table": tab}
    for n, layer in lstms.items():
        params |= {f"{n}/kernel": layer.weight_ih_l0, f"{n}/recurrent_kernel": layer.weight_hh_l0}
        params[f"{n}/bias"] = layer.bias_ih_l0
    for n, head in heads.items():
        params |= {f"{n}/kernel": head.weight, f"{n}/bias": head.bias}
    order = [params[v.node.name] for _, v in pairs]
    torch_opt = TFAdam(order, 0.02, 0.9, 0.999, 1e-8)

    for step in range(STEPS):
        xb, yb = rng.integers(0, vocab, (b, t)).astype(np.int32), rng.integers(0, classes, b).astype(np.int32)
        lengths = rng.integers(1, t + 1, b)
        tokens = rng.integers(0, classes, (b, t)).astype(np.int32)
        tokens[np.arange(t)[None, :] >= lengths[:, None]] = -100  # padding: no loss
        _, got_loss, got_norm = sess.run([train, loss, norm], {ids: xb, y: yb, y_tokens: tokens})

        torch_opt.zero_grad()
        s1, _ = lstms["lstm1"](tab[torch.from_numpy(xb).long()])
        s2, (h2, _) = lstms["lstm2"](s1)
        want_loss = F.cross_entropy(heads["out"](torch.cat([h2[0], s2.mean(1)], 1)), torch.from_numpy(yb).long())
        tok_logits = heads["tok"](s2).reshape(-1, classes)
        want_loss = want_loss + F.cross_entropy(
            tok_logits, torch.from_numpy(tokens).long().reshape(-1), ignore_index=-100
        )
        want_loss.backward()
        grads = [p.grad for p in order]
        want_norm = torch.sqrt(sum((gr * gr).sum() for gr in grads))
        for gr in grads:  # clip_grad_norm_ divides by norm + 1e-6; cellgraph and TensorFlow by the norm
            gr.mul_(clip / max(float(want_norm), clip))
        torch_opt.step()

        np.testing.assert_allclose(got_norm, float(want_norm), **TOL, err_msg=f"global norm at step {step}")
        want = {k: (p.T if k.endswith("kernel") else p) for k, p in params.items()}
        _check(step, sess.variable_values(), want, float(got_loss), want_loss.item())


# ------------------------------------------------------------------ transformer block
def test_transformer_block_with_adamw_on_a_cosine_schedule_trains_as_torch() -> None:
    b, t, d, heads, ff, classes = 4, 5, 8, 2, 12, 3
    lr, weight_decay, warmup, decay, alpha = 0.01, 0.1, 3, 8, 0.1
    rng = np.random.default_rng(1)
    schedule = cg.optim.cosine_decay(lr, decay_steps=decay, warmup_steps=warmup, alpha=alpha)
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, t, d), "float64", name="x")
        y = cg.placeholder((None,), "int32", name="y")
        mask = cg.placeholder((None, t, t), "bool", name="mask")
        present = cg.placeholder((None, t, 1), "float64", name="present")
        ln1 = cg.layers.layer_norm(x, name="ln1")
        h = x + cg.layers.multi_head_attention(ln1, num_heads=heads, mask=mask, name="mha")
        hidden = cg.layers.dense(cg.layers.layer_norm(h, name="ln2"), ff, activation="gelu", name="ff1")
        h = h + cg.layers.dense(hidden, d, name="ff2")
        pooled = cg.reduce_sum(h * present, axis=1) / cg.reduce_sum(present, axis=1)
        loss = cg.losses.sparse_softmax_cross_entropy(cg.layers.dense(pooled, classes, name="out"), y)
        global_step = cg.variable(0, dtype="int64", name="global_step", trainable=False)
        train = cg.optim.AdamW(schedule, weight_decay=weight_decay).minimize(loss, global_step=global_step)
    sess = cg.Session(g)
    start = {k: torch.tensor(v) for k, v in sess.variable_values().items()}

    mha = torch.nn.MultiheadAttention(d, heads, batch_first=True).double()
    norms = {n: torch.nn.LayerNorm(d).double() for n in ("ln1", "ln2")}
    dense = {n: torch.nn.Linear(i, o).double() for n, i, o in (("ff1", d, ff), ("ff2", ff, d), ("out", d, classes))}
    qkv = ("query", "key", "value")
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.cat([start[f"mha/{n}/kernel"].T for n in qkv]))
        mha.in_proj_bias.copy_(torch.cat([start[f"mha/{n}/bias"] for n in qkv]))
        mha.out_proj.weight.copy_(start["mha/output/kernel"].T)
        mha.out_proj.bias.copy_(start["mha/output/bias"])
        for n, layer in dense.items():
            layer.weight.copy_(start[f"{n}/kernel"].T)
            layer.bias.copy_(start[f"{n}/bias"])
    modules = [mha, *norms.values(), *dense.values()]

    def rate(step: int) -> float:  # the schedule written out: a linear warm-up from 0, then torch's cosine
        if step < warmup:
            return lr * step / warmup
        return alpha * lr + (lr - alpha * lr) * (1 + math.cos(math.pi * min(step - warmup, decay) / decay)) / 2

    torch_opt = TFAdam([p for m in modules for p in m.parameters()], 0.0, 0.9, 0.999, 1e-8, weight_decay)

    for step in range(STEPS):
        assert schedule.value(step) == pytest.approx(rate(step), rel=1e-14, abs=1e-17)
        xb, yb = rng.normal(size=(b, t, d)), rng.integers(0, classes, b).astype(np.int32)
        lengths = rng.integers(1, t + 1, b)
        keys = np.arange(t)[None, :] < lengths[:, None]  # (b, t): the positions present
        allowed = np.tril(np.ones((t, t), bool))[None] & keys[:, None, :]  # causal and padding
        kept = keys.astype(np.float64)[:, :, None]
        _, got_loss = sess.run([train, loss], {x: xb, y: yb, mask: allowed, present: kept})

        torch_opt.zero_grad()
        torch_opt.lr = rate(step)
        xt, kt = torch.from_numpy(xb), torch.from_numpy(kept)
        a = norms["ln1"](xt)
        blocked = torch.from_numpy(~allowed).repeat_interleave(heads, 0)  # torch masks what is true
        ht = xt + mha(a, a, a, attn_mask=blocked, need_weights=False)[0]
        ht = ht + dense["ff2"](F.gelu(dense["ff1"](norms["ln2"](ht))))
        logits = dense["out"]((ht * kt).sum(1) / kt.sum(1))
        want_loss = F.cross_entropy(logits, torch.from_numpy(yb).long())
        want_loss.backward()
        torch_opt.step()

        want = {"mha/output/kernel": mha.out_proj.weight.T, "mha/output/bias": mha.out_proj.bias}
        for i, n in enumerate(qkv):
            want[f"mha/{n}/kernel"] = mha.in_proj_weight[i * d : (i + 1) * d].T
            want[f"mha/{n}/bias"] = mha.in_proj_bias[i * d : (i + 1) * d]
        # Softmax over the keys ignores what the key bias adds to every key's score alike: its gradient is 0 but
        # for rounding, which Adam's normalised step turns into moves of either sign on either side.
        del want["mha/key/bias"]
        for n, norm in norms.items():
            want |= {f"{n}/gamma": norm.weight, f"{n}/beta": norm.bias}
        for n, layer in dense.items():
            want |= {f"{n}/kernel": layer.weight.T, f"{n}/bias": layer.bias}
        _check(step, sess.variable_values(), want, float(got_loss), want_loss.item())
    assert int(sess.run(global_step)) == STEPS


# ------------------------------------------------------------------ CNN with batch norm
def test_cnn_with_batch_norm_and_nesterov_trains_then_evaluates_as_torch() -> None:
    b, size, channels, classes = 6, 8, 3, 4
    lr, mu, weight_decay, momentum, epsilon = 0.05, 0.9, 1e-3, 0.9, 1e-3
    rng = np.random.default_rng(2)
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, size, size, channels), "float64", name="x")
        y = cg.placeholder((None,), "int32", name="y")
        training = cg.layers.training_switch()

        def norm(h: Any, name: str) -> Any:
            return cg.relu(cg.layers.batch_norm(h, training, momentum=momentum, epsilon=epsilon, name=name))

        h = norm(cg.layers.conv2d(x, 5, 3, use_bias=False, name="c1"), "bn1")
        h = cg.layers.max_pool2d(h, 3, 2, "SAME")  # overlapping windows; SAME pads the end (8 -> 4)
        h = cg.layers.avg_pool2d(norm(cg.layers.conv2d(h, 6, 3, use_bias=False, name="c2"), "bn2"), 2)
        h = norm(cg.layers.dense(cg.layers.flatten(h), 10, use_bias=False, name="d1"), "bn3")
        logits = cg.layers.dense(h, classes, name="d2")
        data_loss = cg.losses.sparse_softmax_cross_entropy(logits, y)
        opt = cg.optim.Momentum(lr, mu, nesterov=True)
        trained = [v for _, v in opt.compute_gradients(data_loss)]
        penalty = cg.losses.l2_loss(trained[0])
        for v in trained[1:]:
            penalty = penalty + cg.losses.l2_loss(v)
        train = opt.minimize(data_loss + weight_decay * penalty)  # the gradient of wd/2 |w|^2 is torch's wd * w
    sess = cg.Session(g)
    start = {k: torch.tensor(v) for k, v in sess.variable_values().items()}

    convs = {
        "c1": torch.nn.Conv2d(channels, 5, 3, padding=1, bias=False),
        "c2": torch.nn.Conv2d(5, 6, 3, padding=1, bias=False),
    }
    d1, d2 = torch.nn.Linear(24, 10, bias=False), torch.nn.Linear(10, classes)
    bns = {"bn1": torch.nn.BatchNorm2d(5), "bn2": torch.nn.BatchNorm2d(6), "bn3": torch.nn.BatchNorm1d(10)}
    modules = [*convs.values(), d1, d2, *bns.values()]
    for m in modules:
        m.double()
    for bn in bns.values():
        bn.eps, bn.momentum = epsilon, 1 - momentum  # Keras' momentum keeps the old value; torch's takes the new
    with torch.no_grad():
        for n, conv in convs.items():
            conv.weight.copy_(start[f"{n}/kernel"].permute(3, 2, 0, 1))  # (kh, kw, in, out) -> (out, in, kh, kw)
        d1.weight.copy_(start["d1/kernel"].T)
        d2.weight.copy_(start["d2/kernel"].T)
        d2.bias.copy_(start["d2/bias"])
    params = {"c1/kernel": convs["c1"].weight, "c2/kernel": convs["c2"].weight, "d1/kernel": d1.weight}
    params |= {"d2/kernel": d2.weight, "d2/bias": d2.bias}
    for n, bn in bns.items():
        params |= {f"{n}/gamma": bn.weight, f"{n}/beta": bn.bias}
    torch_opt = torch.optim.SGD(
        [params[v.node.name] for v in trained], lr=lr, momentum=mu, nesterov=True, weight_decay=weight_decay
    )
    biased = {n: np.ones(bn.num_features) for n, bn in bns.items()}  # the Keras-convention moving variance
    seen: dict[str, Any] = {}

    def forward(xb: np.ndarray, train_mode: bool) -> Any:
        for m in modules:
            m.train(train_mode)
        h = convs["c1"](torch.from_numpy(xb).permute(0, 3, 1, 2))
        seen["bn1"] = h.detach()
        h = F.max_pool2d(F.pad(F.relu(bns["bn1"](h)), (0, 1, 0, 1), value=-math.inf), 3, 2)
        h = convs["c2"](h)
        seen["bn2"] = h.detach()
        h = F.avg_pool2d(F.relu(bns["bn2"](h)), 2)
        h = d1(h.permute(0, 2, 3, 1).reshape(len(xb), -1))  # flatten in NHWC order
        seen["bn3"] = h.detach()
        return d2(F.relu(bns["bn3"](h)))

    for step in range(STEPS):
        xb, yb = rng.normal(size=(b, size, size, channels)), rng.integers(0, classes, b).astype(np.int32)
        _, got_loss = sess.run([train, data_loss], {x: xb, y: yb})
        torch_opt.zero_grad()
        want_loss = F.cross_entropy(forward(xb, True), torch.from_numpy(yb).long())
        want_loss.backward()
        torch_opt.step()

        got = sess.variable_values()
        want = {
            k: (p.permute(2, 3, 1, 0) if k.startswith("c") else p.T if k.endswith("kernel") else p)
            for k, p in params.items()
        }
        _check(step, got, want, float(got_loss), want_loss.item())
        for n, bn in bns.items():
            batch = seen[n]
            axes = (0, 2, 3) if batch.dim() == 4 else (0,)
            count = batch.numel() // bn.num_features
            biased[n] = momentum * biased[n] + (1 - momentum) * batch.var(axes, unbiased=False).numpy()
            np.testing.assert_allclose(got[f"{n}/moving_mean"], bn.running_mean.numpy(), **TOL)
            np.testing.assert_allclose(got[f"{n}/moving_variance"], biased[n], **TOL)
            if step == 0:  # from 1, torch moved by count / (count - 1) times the batch's biased variance
                unbiased = momentum + (1 - momentum) * (biased[n] - momentum) / (1 - momentum) * count / (count - 1)
                np.testing.assert_allclose(bn.running_var.numpy(), unbiased, **TOL)

    xe = rng.normal(size=(5, size, size, channels))
    got_eval = sess.run(logits, {x: xe, training: False})
    with torch.no_grad():
        for n, bn in bns.items():
            bn.running_var.copy_(torch.from_numpy(sess.variable_values()[f"{n}/moving_variance"]))
        want_eval = forward(xe, False)
    np.testing.assert_allclose(got_eval, want_eval.numpy(), **TOL, err_msg="inference with the moving statistics")
    # Evaluating moved nothing.
    after = sess.variable_values()
    for n, bn in bns.items():
        np.testing.assert_allclose(after[f"{n}/moving_mean"], bn.running_mean.numpy(), **TOL)
