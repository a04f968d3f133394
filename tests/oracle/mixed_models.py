"""Two small models built with ``cg.layers`` under a dtype policy, and their PyTorch twins under ``torch.autocast``.

- ``cnn``: conv2d (3x3, SAME) -> batch_norm (training) -> relu -> 2x2 max pool -> flatten -> dense;
- ``sequence``: embedding -> multi-head self-attention + residual -> layer_norm -> lstm -> dense on the last state.

The torch side is written out with ``torch.nn.functional`` from cellgraph's initial weights (Keras's layout,
transposed where torch's differs). What cellgraph computes in float32 under a mixed policy (batch and layer
normalization, attention's softmax, the loss) is written in float32 there too, as Keras does; the rest is left to
autocast, with the few explicit casts that keep a half tensor half where cellgraph's layer returns one (an
embedding's rows, a residual sum).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812

import cellgraph as cg

TORCH_DTYPES = {"mixed_float16": torch.float16, "mixed_bfloat16": torch.bfloat16, "float32": None}
B, CLASSES = 8, 3
CNN_SHAPE = (8, 8, 2)
T, VOCAB, D, HEADS, UNITS = 6, 13, 8, 2, 8


@dataclass
class Built:
    """A cellgraph model: its graph, feeds, loss, training op and (under float16) its loss-scale wrapper."""

    graph: cg.Graph
    x: cg.Tensor
    y: cg.Tensor
    boost: cg.Tensor  # the loss is multiplied by it: fed large, it injects an overflow into the float16 backward
    logits: cg.Tensor
    loss: cg.Tensor
    train: Any
    mp: Any = None
    norm: cg.Tensor | None = None

    def session(self) -> cg.Session:
        return cg.Session(self.graph)


def build(model: str, policy: str, lr: float, clip: float | None = None, initial_scale: float = 2.0**10) -> Built:
    """``model`` ("cnn" or "sequence") under ``policy``; SGD, under a loss scale for ``mixed_float16``
    (``mixed_bfloat16`` trains without one, as in Keras and torch); gradients clipped to ``clip`` if given."""
    g = cg.Graph()
    with g.as_default(), cg.layers.policy(policy):
        if model == "cnn":
            x = cg.placeholder((None, *CNN_SHAPE), name="x")
            h = cg.layers.conv2d(x, 4, 3, name="conv")
            h = cg.layers.max_pool2d(cg.relu(cg.layers.batch_norm(h, training=True, name="bn")))
            logits = cg.layers.dense(cg.layers.flatten(h), CLASSES, name="out")
        else:
            x = cg.placeholder((None, T), "int32", name="x")
            e = cg.layers.embedding(x, VOCAB, D, name="emb")
            h = cg.layers.layer_norm(e + cg.layers.multi_head_attention(e, num_heads=HEADS, name="mha"), name="ln")
            _, (last, _) = cg.layers.lstm(h, UNITS, name="lstm")
            logits = cg.layers.dense(last, CLASSES, name="out")
        y = cg.placeholder((None,), "int32", name="y")
        boost = cg.placeholder_with_default(np.float32(1.0), (), name="boost")
        loss = cg.losses.sparse_softmax_cross_entropy(logits, y) * boost
        opt = cg.optim.SGD(lr)
        mp = cg.optim.mixed_precision(opt, initial_scale=initial_scale) if policy == "mixed_float16" else None
        trainer = mp or opt
        pairs = trainer.compute_gradients(loss)
        norm = None
        if clip is not None:
            clipped, norm = cg.optim.clip_by_global_norm([grad for grad, _ in pairs], clip)
            pairs = list(zip(clipped, [v for _, v in pairs]))
        train = trainer.apply_gradients(pairs)
    return Built(g, x, y, boost, logits, loss, train, mp, norm)


def batches(model: str, steps: int, seed: int = 0) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        if model == "cnn":
            x = rng.normal(0, 1, (B, *CNN_SHAPE)).astype(np.float32)
        else:
            x = rng.integers(0, VOCAB, (B, T)).astype(np.int32)
        yield x, rng.integers(0, CLASSES, B).astype(np.int32)


# ------------------------------------------------------------------ the torch twins
Forward = Callable[[dict[str, torch.Tensor], torch.Tensor], torch.Tensor]


def _cnn(p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    h = F.conv2d(x.permute(0, 3, 1, 2), p["conv/kernel"].permute(3, 2, 0, 1), p["conv/bias"], padding=1)
    # Batch norm computes in float32 (Keras's and cellgraph's rule) and returns the input's dtype.
    h = F.batch_norm(h.float(), None, None, p["bn/gamma"], p["bn/beta"], training=True, eps=1e-3).to(h.dtype)
    h = F.max_pool2d(F.relu(h), 2).permute(0, 2, 3, 1).reshape(x.shape[0], -1)  # NHWC order, as cg's flatten
    return F.linear(h, p["out/kernel"].T, p["out/bias"])


def _sequence(p: dict[str, torch.Tensor], ids: torch.Tensor) -> torch.Tensor:
    half = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else torch.float32
    e = p["emb/embeddings"][ids.long()].to(half)
    n, t, kd = ids.shape[0], ids.shape[1], D // HEADS

    def heads(name: str) -> torch.Tensor:
        return F.linear(e, p[f"mha/{name}/kernel"].T, p[f"mha/{name}/bias"]).reshape(n, t, HEADS, kd).transpose(1, 2)

    scores = (heads("query") @ heads("key").transpose(-1, -2)) * (1.0 / kd**0.5)
    weights = torch.softmax(scores.float(), -1).to(scores.dtype)  # softmax in float32
    merged = (weights @ heads("value")).transpose(1, 2).reshape(n, t, D)
    h = (e + F.linear(merged, p["mha/output/kernel"].T, p["mha/output/bias"])).to(half)
    h = F.layer_norm(h.float(), (D,), p["ln/gamma"], p["ln/beta"], eps=1e-5).to(half)
    z = F.linear(h, p["lstm/kernel"].T, p["lstm/bias"])
    hs = cs = None
    for step in range(t):
        zt = z[:, step] if hs is None else z[:, step] + hs @ p["lstm/recurrent_kernel"]
        i, f, g, o = (zt[:, k * UNITS : (k + 1) * UNITS] for k in range(4))
        i, f, g, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)
        cs = i * g if cs is None else f * cs + i * g
        hs = o * torch.tanh(cs)
    return F.linear(hs, p["out/kernel"].T, p["out/bias"])


FORWARD: dict[str, Forward] = {"cnn": _cnn, "sequence": _sequence}


@dataclass
class TorchRun:
    losses: list[float]
    params: dict[str, np.ndarray]
    scales: list[float]
    norms: list[float]


def torch_train(
    model: str,
    policy: str,
    start: dict[str, np.ndarray],
    data: list[tuple[np.ndarray, np.ndarray]],
    lr: float,
    clip: float | None = None,
    boosts: dict[int, float] | None = None,
    initial_scale: float = 2.0**10,
) -> TorchRun:
    """Train ``model``'s twin from ``start`` on ``data``: autocast to the policy's dtype, a GradScaler for float16,
    ``unscale_`` then ``clip_grad_norm_`` when clipping (PyTorch's recipe)."""
    dtype = TORCH_DTYPES[policy]
    params = {k: torch.tensor(v, requires_grad=True) for k, v in start.items()}
    opt = torch.optim.SGD(list(params.values()), lr=lr)
    scaler = torch.amp.GradScaler("cpu", init_scale=initial_scale, enabled=dtype == torch.float16)
    run = TorchRun([], {}, [], [])
    for step, (x, y) in enumerate(data):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            logits = FORWARD[model](params, torch.from_numpy(x))
        loss = F.cross_entropy(logits.float(), torch.from_numpy(y).long()) * (boosts or {}).get(step, 1.0)
        scaler.scale(loss).backward()
        if clip is not None:
            scaler.unscale_(opt)
            run.norms.append(float(torch.nn.utils.clip_grad_norm_(list(params.values()), clip)))
        scaler.step(opt)
        scaler.update()
        run.losses.append(loss.item())
        run.scales.append(float(scaler.get_scale()) if scaler.is_enabled() else 1.0)
    run.params = {k: v.detach().numpy().copy() for k, v in params.items()}
    return run


__all__ = ["B", "CLASSES", "Built", "TorchRun", "batches", "build", "torch_train"]
