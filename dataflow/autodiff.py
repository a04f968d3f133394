"""Reverse-mode autodiff: build the backward graph from the registry's rules.

Each rule returns one gradient per input of its op. Gradients flowing into a
tensor from several consumers are summed; gradients of broadcasting ops are
summed back to each input's shape; and every gradient is checked against the
input's shape and dtype right where the rule produced it, so a wrong rule
fails naming its own op instead of somewhere downstream.
"""

from __future__ import annotations

from collections.abc import Sequence

from .dtypes import is_float
from .errors import GradientError
from .graph import Node, Tensor
from .opdef import not_differentiable
from .ops.array import reshape_like
from .ops.base import graph_of
from .ops.math import add, ones_like, sum_to_shape_of
from .shapes import fmt


def gradients(
    ys: Tensor | Sequence[Tensor],
    xs: Tensor | Sequence[Tensor],
    grad_ys: Tensor | Sequence[Tensor | None] | None = None,
) -> list[Tensor | None]:
    """Gradients of ``sum(ys)`` with respect to each of ``xs`` (None where none flows).

    Examples
    --------
    >>> import cellgraph as cg
    >>> g = cg.Graph()
    >>> with g.as_default():
    ...     x = cg.placeholder((3,), "float32", name="x")
    ...     [dx] = cg.gradients(cg.reduce_sum(x * x), [x])
    >>> cg.Session(g).run(dx, {x: [1.0, 2.0, 3.0]})
    array([2., 4., 6.], dtype=float32)
    """
    ys = [ys] if isinstance(ys, Tensor) else list(ys)
    xs = [xs] if isinstance(xs, Tensor) else list(xs)
    if grad_ys is None or isinstance(grad_ys, Tensor):
        grad_ys = [grad_ys] * len(ys) if grad_ys is None else [grad_ys]
    if len(grad_ys) != len(ys):
        raise GradientError(f"gradients() got {len(ys)} ys but {len(grad_ys)} grad_ys")
    graph = graph_of([*ys, *xs])
    for y in ys:
        if not is_float(y.dtype):
            raise GradientError(f"cannot differentiate {y.name!r}: its dtype is {y.dtype}, not a float")

    order = _between(ys, xs)
    pending: dict[tuple[int, int], list[Tensor]] = {}
    with graph.name_scope("gradients"):
        for k, (y, gy) in enumerate(zip(ys, grad_ys)):
            pending.setdefault(_key(y), []).append(ones_like(y) if gy is None else _seed(k, y, gy))
        for node in reversed(order):
            dys = [_total(pending.get((id(node), i), [])) for i in range(len(node.specs))]
            for i, total in enumerate(dys):  # sum fan-out once; xs read the sum later
                if total is not None:
                    pending[(id(node), i)] = [total]
            if all(d is None for d in dys) or not node.inputs:
                continue
            opdef = node.opdef
            if opdef.grad is not_differentiable:
                continue  # a recorded decision: nothing flows back through this op
            with graph.colocate_with(node):
                grads = list(opdef.grad(node, dys))  # type: ignore[operator]
                if len(grads) != len(node.inputs):
                    raise GradientError(
                        f"gradient rule of {node.describe()} returned {len(grads)} gradients for {len(node.inputs)} inputs"
                    )
                for i, (x, gx) in enumerate(zip(node.inputs, grads)):
                    if gx is None:
                        continue
                    if opdef.broadcasts and (gx.shape != x.shape or may_broadcast(x, node.inputs)):
                        gx = sum_to_shape_of(gx, x)
                    _check(node, i, x, gx)
                    pending.setdefault(_key(x), []).append(gx)
    return [_total(pending.get(_key(x), [])) for x in xs]


def may_broadcast(x: Tensor, operands: Sequence[Tensor]) -> bool:
    """Whether ``x`` may be broadcast at run time against the other ``operands``.

    Equal static shapes prove nothing when a dimension is unknown: (None, 4)
    fed (1, 4) against (None, 4) fed (5, 4) is stretched five times, and its
    gradient must be summed back. Only an axis where ``x`` has a known size
    other than 1, or where every other operand has a known 1 (or no such axis),
    is sure to keep its size; elsewhere the sum-back is decided at run time.
    """
    rank = len(x.shape)
    for t in operands:
        if len(t.shape) > rank:
            return True
    for i, d in enumerate(x.shape):
        if d is not None and d != 1:
            continue
        for t in operands:
            j = i - (rank - len(t.shape))
            if t is not x and j >= 0 and t.shape[j] != 1:
                return True
    return False


def _key(t: Tensor) -> tuple[int, int]:
    return (id(t.node), t.index)


def _total(parts: list[Tensor]) -> Tensor | None:
    if not parts:
        return None
    total = parts[0]
    for part in parts[1:]:
        total = add(total, part, name="accumulate_grad")
    return total


def _seed(k: int, y: Tensor, gy: Tensor) -> Tensor:
    """``grad_ys[k]``, which must have ``y``'s shape when the graph runs too.

    A seed of another shape went into the gradient rules as it was: broadcast by some (a (1,) seed for a (3,)
    sigmoid gave the same slope three times when fused) and read as given by others (the unfused SigmoidGrad
    returned a (1,) gradient for the (3,) input), without a word; torch's ``backward(gradient)`` refuses it.
    """
    if not (len(gy.shape) == len(y.shape) and all(a is None or b is None or a == b for a, b in zip(gy.shape, y.shape))):
        raise GradientError(
            f"grad_ys[{k}] ({gy.name!r}) has shape {fmt(gy.shape)} but ys[{k}] ({y.name!r}) has {fmt(y.shape)}"
        )
    if gy.shape == y.shape and None not in y.shape:
        return gy
    # Fails the run, naming this node, when the fed seed's shape differs from y's (a transposed one of y's size too).
    return reshape_like(gy, y, name="grad_ys_in_the_shape_of_ys", same_shape=True)


def _check(node: Node, i: int, x: Tensor, gx: Tensor) -> None:
    fits = len(gx.shape) == len(x.shape) and all(a is None or b is None or a == b for a, b in zip(gx.shape, x.shape))
    if not fits or gx.dtype != x.dtype:
        raise GradientError(
            f"gradient rule of {node.describe()} returned {fmt(gx.shape)} {gx.dtype} for input {i} "
            f"({x.name!r}), which is {fmt(x.shape)} {x.dtype}"
        )


def _between(ys: list[Tensor], xs: list[Tensor]) -> list[Node]:
    """Nodes on some path from an x to a y, in topological order."""
    from .executor import schedule

    upstream = schedule(ys, [], [])
    reaches: set[int] = {id(x.node) for x in xs}
    on_path: list[Node] = []
    for node in upstream:  # inputs come first, so one forward sweep suffices
        if id(node) in reaches or any(id(t.node) in reaches for t in node.inputs):
            reaches.add(id(node))
            on_path.append(node)
    return on_path
