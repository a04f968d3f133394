"""A gradient kept as the chunks it arrived in: the server updates from the received bytes, with no copy into one array.

A gradient larger than a chunk (4 MiB) arrives in several messages. Copying
each chunk into one preallocated array costs a pass over the push's bytes
that nothing needs: every optimizer update (and the sync sum, and a moving
statistic's average) is elementwise, so it can run on each piece of the
variable in turn, reading each piece of the gradient where gRPC left it.
``Pieced`` is such a gradient: its shape and dtype, and flat read-only views
of the received bytes that cover it in order.

``parts`` gives the pieces of any gradient (a whole array is one piece), and
``update_in_parts`` runs an optimizer's update piece by piece. A slot that is
one value per variable (Adam's step count) is not split: every piece starts
from the value it had before the update, so the count moves once.

Examples
--------
>>> import numpy as np
>>> g = Pieced((2, 3), np.dtype("float32"), [np.ones(4, np.float32), np.full(2, 2, np.float32)])
>>> [(where.start, where.stop, piece.tolist()) for where, piece in parts(g)]
[(0, 4, [1.0, 1.0, 1.0, 1.0]), (4, 6, [2.0, 2.0])]
>>> g.whole()
array([[1., 1., 1.],
       [1., 2., 2.]], dtype=float32)
>>> var = np.zeros((2, 3), np.float32)
>>> def sgd(var, slots, grad):
...     var -= 0.5 * grad
>>> update_in_parts(sgd, var, {}, g)
>>> var
array([[-0.5, -0.5, -0.5],
       [-0.5, -1. , -1. ]], dtype=float32)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from .updates import Update


class Pieced:
    """A tensor of ``shape`` and ``dtype`` held as flat pieces that follow each other and cover it exactly."""

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype, pieces: Sequence[np.ndarray]) -> None:
        self.shape, self.dtype = shape, np.dtype(dtype)
        self.size = math.prod(shape)
        self.pieces = list(pieces)
        if sum(p.size for p in self.pieces) != self.size or any(p.ndim != 1 for p in self.pieces):
            raise ValueError(f"pieces of {[p.shape for p in self.pieces]} do not cover shape {shape}")

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def whole(self) -> np.ndarray:
        """The tensor as one new array (a copy: for the rare reader that needs one, e.g. an error's counts)."""
        out = np.empty(self.size, self.dtype)
        for where, piece in parts(self):
            out[where] = piece
        return out.reshape(self.shape)

    def __repr__(self) -> str:
        return f"Pieced(shape={self.shape}, dtype={self.dtype.name}, pieces={len(self.pieces)})"


Gradient = np.ndarray | Pieced


def parts(grad: Gradient) -> list[tuple[slice, np.ndarray]]:
    """``(where, piece)`` pairs: the flat elements ``where`` of the tensor are ``piece`` (1-D)."""
    if isinstance(grad, np.ndarray):
        return [(slice(0, grad.size), np.ascontiguousarray(grad).reshape(-1))]
    out, at = [], 0
    for piece in grad.pieces:
        out.append((slice(at, at + piece.size), piece))
        at += piece.size
    return out


def update_in_parts(update: Update, var: np.ndarray, slots: Mapping[str, np.ndarray], grad: Gradient) -> None:
    """``update(var, slots, grad)``, run on each piece of ``grad`` and the same elements of ``var`` and its
    slots; a whole array is one call. Slots of another size than ``var`` (one value per variable) are given
    whole, and reset to their value before the update for each piece after the first."""
    if isinstance(grad, np.ndarray):
        update(var, slots, grad)
        return
    flat_var = var.reshape(-1)
    per_variable = {name: slot.copy() for name, slot in slots.items() if slot.size != var.size}
    for i, (where, piece) in enumerate(parts(grad)):
        if i:
            for name, before in per_variable.items():
                np.copyto(slots[name], before)
        split = {name: slot if name in per_variable else slot.reshape(-1)[where] for name, slot in slots.items()}
        update(flat_var[where], split, piece)


def add_in_parts(total: np.ndarray, grad: Gradient) -> None:
    """``total += grad``, in place, piece by piece."""
    flat_total = total.reshape(-1)
    for where, piece in parts(grad):
        np.add(flat_total[where], piece, out=flat_total[where])
