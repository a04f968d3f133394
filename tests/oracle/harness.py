"""Running one computation both ways and comparing: cellgraph's session against torch's autograd.

Both sides differentiate ``sum_i sum(out_i * w_i)`` for random weights ``w_i``
(a random upstream cotangent, so every output element matters), with respect
to every float input.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

import cellgraph as cg

from .rows import Row, build, concrete


def as_tuple(value: Any) -> tuple[Any, ...]:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def weights_like(rng: np.random.Generator, shapes: Sequence[tuple[int, ...]]) -> list[np.ndarray]:
    return [rng.uniform(0.5, 1.5, shape) for shape in shapes]


def torch_side(
    fn: Any, arrays: Sequence[np.ndarray], weights: Sequence[np.ndarray] | None, extra: Sequence[Any] = ()
) -> tuple[list[np.ndarray], list[np.ndarray | None]]:
    """``fn``'s outputs, and (with ``weights``) the gradient of the weighted sum for each float input."""
    leaves = [
        torch.tensor(a, requires_grad=True) if a.dtype.kind == "f" else torch.from_numpy(a.copy()) for a in arrays
    ]
    outs = as_tuple(fn(*leaves, *extra))
    values = [o.detach().numpy().copy() for o in outs]
    if weights is None:
        return values, []
    floats = [t for t in leaves if t.dtype.is_floating_point]
    loss = sum((o * torch.from_numpy(w)).sum() for o, w in zip(outs, weights))
    if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
        return values, [None] * len(floats)
    grads = torch.autograd.grad(loss, floats, allow_unused=True)
    return values, [None if g is None else g.detach().numpy().copy() for g in grads]


def compare(
    what: str, got: np.ndarray | None, want: np.ndarray | None, shape: tuple[int, ...], rtol: float, atol: float
) -> None:
    """``got`` (cellgraph) against ``want`` (torch); a missing gradient on one side must be zero on the other."""
    if got is None and want is None:
        return
    if got is None:
        assert not np.any(want), f"{what}: cellgraph gives no gradient, torch gives {want}"
        return
    got = np.asarray(got)
    assert got.shape == shape, f"{what}: cellgraph gives shape {got.shape}, expected {shape}"
    assert got.dtype == np.float64, f"{what}: cellgraph gives {got.dtype}, expected float64"
    expected = np.zeros(shape) if want is None else want
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol, equal_nan=True, err_msg=what)


def check_row(row: Row, sizes: dict[str, int], dynamic: bool, fuse: bool) -> None:
    """Run ``row`` at ``sizes`` (named dims None in the placeholders when ``dynamic``) and compare with torch."""
    rng = np.random.default_rng(zlib.crc32(f"{row.label}/{sorted(sizes.items())}".encode()))
    arrays = [spec.make(rng, concrete(spec.shape, sizes)) for spec in row.inputs]
    g, tensors, outs = build(row, arrays, sizes, dynamic)
    feeds = {t: a for i, (t, a) in enumerate(zip(tensors, arrays)) if i not in row.variables}
    sess = cg.Session(g, fuse=fuse)
    compared = outs[: len(outs) - row.aux]
    if row.aux:  # the output shapes, from cellgraph: torch needs the aux values first
        shapes = [np.shape(v) for v in sess.run(list(compared), feeds)]
    else:
        shapes = [np.shape(v) for v in torch_side(row.torch, arrays, None)[0]]
    weights = weights_like(rng, shapes)
    wrt = [i for i, spec in enumerate(row.inputs) if spec.is_float]
    with g.as_default():
        ws = [cg.placeholder(o.shape, o.dtype, name=f"w{i}") for i, o in enumerate(compared)]
        probes = [o * w for o, w in zip(compared, ws)]
        loss = cg.reduce_sum(probes[0])
        for p in probes[1:]:
            loss = loss + cg.reduce_sum(p)
        grads = cg.gradients(loss, [tensors[i] for i in wrt])
    feeds.update(zip(ws, weights))

    # Forward only, each output read by nothing but its Mul: fusion may take the op in.
    first = sess.run([*probes, *outs[len(compared) :]], feeds)
    want_first = torch_side(row.torch, arrays, None, first[len(probes) :])[0]
    for k, (got, want, w) in enumerate(zip(first, want_first, weights)):
        compare(f"{row.label}: output {k} * weights, forward only", got, want * w, want.shape, row.rtol, row.atol)

    # Outputs and gradients from one run (one dropout mask).
    values = sess.run([*outs, *[gr for gr in grads if gr is not None]], feeds)
    got_outs, got_aux, rest = values[: len(compared)], values[len(compared) : len(outs)], iter(values[len(outs) :])
    got_grads = [None if gr is None else next(rest) for gr in grads]
    want_outs, want_grads = torch_side(row.torch, arrays, weights, got_aux)
    assert len(want_outs) == len(compared), f"{row.label}: {len(compared)} outputs, torch gives {len(want_outs)}"
    for k, (got, want) in enumerate(zip(got_outs, want_outs)):
        compare(f"{row.label}: output {k}", got, want, want.shape, row.rtol, row.atol)
    for i, got, want in zip(wrt, got_grads, want_grads):
        compare(f"{row.label}: gradient of input {i}", got, want, arrays[i].shape, row.rtol, row.atol)
