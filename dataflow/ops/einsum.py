"""``einsum``: Einstein summation over one or more tensors, as existing ops.

An einsum is a composition, not an op of its own: the contractions a
Transformer writes (``"bqhd,bkhd->bhqk"``, ``"bhqk,bkhd->bqhd"``,
``"btd,de->bte"``) are batched matrix products once each operand's axes are
put in (batch, free, contracted) order, and that is what this module builds.
For two operands:

- a label only one operand has, and neither the output nor a later operand
  needs, is summed out of that operand first (ReduceSum);
- labels of both operands that the result keeps are batch dims; labels of
  both that it drops are the contraction (K); the rest are each operand's
  free dims (M and N);
- each operand is transposed to (batch, M, K) and (batch, K, N) (a transpose
  flag of the product when that is all it takes, no Transpose at all when the
  axes are already in order), its M, K and N groups merged by one Reshape
  only when a group is not exactly one axis, multiplied by one MatMul or
  BatchMatMul, split back, and transposed to the output's order.

More operands are contracted left to right, each pair keeping the labels a
later operand or the output still needs. So the speed is that of the product
kernels, and the gradients are those of the ops used: no rule of its own.

Not supported, each refused by name: repeated labels within one operand
(diagonals), repeated output labels, and ``...`` (spell the batch axes out).

>>> import cellgraph as cg
>>> import numpy as np
>>> q = cg.constant(np.ones((2, 3, 4, 5), np.float32))
>>> k = cg.constant(np.ones((2, 6, 4, 5), np.float32))
>>> cg.einsum("bqhd,bkhd->bhqk", q, k).shape
(2, 4, 3, 6)
"""

from __future__ import annotations

import string

from ..errors import ShapeError
from ..graph import Tensor
from .array import reshape, transpose
from .base import TensorLike, as_tensor, graph_of
from .math import matmul, reduce_sum

__all__ = ["einsum"]

_LETTERS = set(string.ascii_letters)


def _parse(equation: str, count: int) -> tuple[list[str], str]:
    """(labels of each operand, output labels), checked; a ShapeError quoting the equation."""
    eq = equation.replace(" ", "")
    where = f"einsum {equation!r}"
    if "." in eq:
        raise ShapeError(f"{where}: '...' is not supported; name each batch axis with a letter")
    lhs, arrow, out = eq.partition("->")
    inputs = lhs.split(",")
    if len(inputs) != count:
        raise ShapeError(f"{where}: the equation names {len(inputs)} operand(s) but {count} were given")
    for i, labels in enumerate(inputs):
        bad = sorted(set(labels) - _LETTERS)
        if bad:
            raise ShapeError(f"{where}: operand {i} has {bad[0]!r}; labels are letters a-z and A-Z")
        repeated = sorted({c for c in labels if labels.count(c) > 1})
        if repeated:
            raise ShapeError(
                f"{where}: label {repeated[0]!r} repeats in operand {i} ({labels!r}); "
                "diagonals and traces are not supported"
            )
    if not arrow:
        # NumPy's implicit output: the labels that appear once, in alphabetical order.
        every = "".join(inputs)
        out = "".join(sorted(c for c in set(every) if every.count(c) == 1))
    bad = sorted(set(out) - _LETTERS)
    if bad:
        raise ShapeError(f"{where}: the output has {bad[0]!r}; labels are letters a-z and A-Z")
    repeated = sorted({c for c in out if out.count(c) > 1})
    if repeated:
        raise ShapeError(f"{where}: output label {repeated[0]!r} repeats")
    unknown = sorted(set(out) - set("".join(inputs)))
    if unknown:
        raise ShapeError(f"{where}: output label {unknown[0]!r} is in no operand")
    return inputs, out


def _sizes(equation: str, inputs: list[str], tensors: list[Tensor]) -> dict[str, int | None]:
    """The static size of every label (None where unknown); a ShapeError on a rank or size clash."""
    sizes: dict[str, int | None] = {}
    for i, (labels, t) in enumerate(zip(inputs, tensors)):
        if len(labels) != len(t.shape):
            raise ShapeError(
                f"einsum {equation!r}: operand {i} has {len(labels)} label(s) ({labels!r}) "
                f"but rank {len(t.shape)} (shape {t.shape})"
            )
        for c, d in zip(labels, t.shape):
            known = sizes.get(c)
            if d is not None and known is not None and known != d:
                raise ShapeError(f"einsum {equation!r}: label {c!r} is {known} in one operand and {d} in operand {i}")
            sizes[c] = d if known is None else known
    return sizes


def _dims(labels: str, sizes: dict[str, int | None], equation: str) -> list[int]:
    """Reshape dims for ``labels`` (-1 for the one unknown); a ShapeError if two are unknown."""
    if sum(sizes[c] is None for c in labels) > 1:
        raise ShapeError(
            f"einsum {equation!r}: cannot reshape to axes {labels!r}, more than one of unknown size; "
            "give the placeholders static shapes"
        )
    return [-1 if sizes[c] is None else int(sizes[c] or 0) for c in labels]


def _group_size(labels: str, sizes: dict[str, int | None]) -> int | None:
    total = 1
    for c in labels:
        d = sizes[c]
        if d is None:
            return None
        total *= d
    return total


def _arrange(t: Tensor, have: str, want: str) -> Tensor:
    """``t`` (axes labelled ``have``) transposed so its axes read ``want``."""
    if have == want:
        return t
    return transpose(t, [have.index(c) for c in want])


def _sum_out(t: Tensor, labels: str, keep: set[str]) -> tuple[Tensor, str]:
    """``t`` with every label not in ``keep`` summed out."""
    drop = [i for i, c in enumerate(labels) if c not in keep]
    if not drop:
        return t, labels
    return reduce_sum(t, drop), "".join(c for c in labels if c in keep)


def _operand(t: Tensor, have: str, batch: str, first: str, second: str, sizes: dict, equation: str) -> tuple:
    """``t`` as (batch..., first, second), each group one axis; returns (tensor, transposed flag).

    Prefers the product's transpose flag to a Transpose when the axes already read
    (batch, second, first) and both groups are single axes."""
    one = len(first) <= 1 and len(second) <= 1
    if one and len(first) == 1 and len(second) == 1 and have == batch + second + first:
        return t, True
    t = _arrange(t, have, batch + first + second)
    if len(first) == 1 and len(second) == 1:
        return t, False
    merged = [_group_size(first, sizes), _group_size(second, sizes)]
    dims = _dims(batch, sizes, equation) if batch else []
    if None in merged and (-1 in dims or merged.count(None) > 1):
        raise ShapeError(
            f"einsum {equation!r}: cannot merge axes {first + second!r} of {batch + first + second!r}, "
            "more than one of unknown size; give the placeholders static shapes"
        )
    return reshape(t, [*dims, *(-1 if m is None else m for m in merged)]), False


def _contract(a: Tensor, la: str, b: Tensor, lb: str, keep: set[str], sizes: dict, equation: str) -> tuple:
    """The product of two labelled operands, keeping the labels in ``keep``: (tensor, labels)."""
    batch = "".join(c for c in la if c in lb and c in keep)
    inner = "".join(c for c in la if c in lb and c not in keep)
    m = "".join(c for c in la if c not in lb)
    n = "".join(c for c in lb if c not in la)
    a2, ta = _operand(a, la, batch, m, inner, sizes, equation)
    b2, tb = _operand(b, lb, batch, inner, n, sizes, equation)
    # An operand with no batch axes broadcasts over the other's (BatchMatMul does).
    product = matmul(a2, b2, transpose_a=ta, transpose_b=tb, name="einsum_matmul")
    labels = batch + m + n
    if len(m) == 1 and len(n) == 1:
        return product, labels
    dims = _dims(labels, sizes, equation)
    return reshape(product, dims, name="einsum_split"), labels


def einsum(equation: str, *operands: TensorLike, name: str = "einsum") -> Tensor:
    """Einstein summation: ``equation`` names each operand's axes and the result's.

    Parameters
    ----------
    equation : str
        ``"ab,bc->ac"`` style: one group of letters per operand, separated by
        commas, then ``->`` and the output's letters (without ``->``, NumPy's
        implicit output: the letters that appear once, sorted).
    *operands : TensorLike
        One tensor per group; a letter's size must agree wherever it appears.
    name : str
        Name scope of the ops built.

    Examples
    --------
    >>> import cellgraph as cg
    >>> import numpy as np
    >>> a = cg.constant(np.arange(6, dtype=np.float32).reshape(2, 3))
    >>> cg.Session().run(cg.einsum("ij,ij->i", a, a))
    array([ 5., 50.], dtype=float32)
    """
    if not isinstance(equation, str):
        raise ShapeError(f"einsum: the equation must be a str, got {type(equation).__name__}")
    if not operands:
        raise ShapeError(f"einsum {equation!r}: needs at least one operand")
    graph = graph_of(operands)
    tensors = [as_tensor(t, graph=graph) for t in operands]
    inputs, out = _parse(equation, len(tensors))
    sizes = _sizes(equation, inputs, tensors)
    with graph.name_scope(name):
        current, labels = tensors[0], inputs[0]
        for i in range(1, len(tensors) + 1):
            later = set(out).union(*inputs[i:])
            current, labels = _sum_out(current, labels, later)
            if i == len(tensors):
                break
            other, other_labels = _sum_out(tensors[i], inputs[i], later.union(labels))
            needed = set(out).union(*inputs[i + 1 :])
            current, labels = _contract(current, labels, other, other_labels, needed, sizes, equation)
        return _arrange(current, labels, out)
