"""Static shape arithmetic with unknown (``None``) dimensions."""

from __future__ import annotations

from collections.abc import Sequence

from .opdef import Shape


def fmt(shape: Sequence[int | None]) -> str:
    """``(None, 64)``: how every message prints a shape."""
    dims = ["None" if d is None else str(d) for d in shape]
    return "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"


def broadcast(a: Shape, b: Shape) -> Shape | None:
    """NumPy broadcasting of two static shapes; None when they cannot broadcast."""
    out: list[int | None] = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x == 1:
            out.append(y)
        elif y == 1:
            out.append(x)
        elif x is None:
            out.append(y)
        elif y is None or x == y:
            out.append(x)
        else:
            return None
    return tuple(reversed(out))


def compatible(static: Shape, actual: Sequence[int]) -> bool:
    """Whether a concrete shape fits a static one (``None`` matches any size)."""
    return len(static) == len(actual) and all(s is None or s == a for s, a in zip(static, actual))


def num_elements(shape: Shape) -> int | None:
    n = 1
    for d in shape:
        if d is None:
            return None
        n *= d
    return n


def normalize_axes(axis: int | Sequence[int] | None, rank: int) -> tuple[int, ...] | None:
    """Axes as sorted non-negative ints; None when an axis is out of range."""
    if axis is None:
        return tuple(range(rank))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    out = set()
    for ax in axes:
        if not -rank <= ax < rank:
            return None
        out.add(ax % rank)
    return tuple(sorted(out))
