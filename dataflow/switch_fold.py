"""Plan-time folding of training switches: a plan runs only the branch a switch at its default takes.

``cg.layers.training_switch()`` is a scalar bool ``PlaceholderWithDefault``
with a constant default; dropout and batch norm compute both modes and
``where(switch, train, infer)`` picks one. A plan is built for one set of
feeds, so when the switch is not among them its value is known at build time:
``fold`` replaces every such ``where`` by the branch taken, and the schedule
then never reaches the other branch (a batch-norm network computed both
normalizations and back-propagated through both).

The backward pass needs one more step. Autodiff gives ``where`` the gradients
``where(c, g, 0)`` and ``where(c, 0, g)``: folded, the untaken branch receives
``zeros_like(g)``, and its backward ops still run on those zeros until an
``add`` accumulates them into the taken branch's gradient. ``fold`` follows
these zeros (only those a folded ``where`` passes on) through the ops that keep
them zero (``_ZERO_RULES``: each is linear in the operand named) and turns
``x + zeros`` into ``x``, so none of those ops is scheduled. Each zero tensor
carries tensors whose broadcast shape is its run-time shape. Where static
shapes cannot prove that the zeros leave ``x``'s shape as it is, the ``add``
becomes ``keep_shape(x, *those)``: ``x`` itself unless broadcasting really
enlarges it. Those tensors are ones the plan computes anyway where possible
(``Folding.settle`` replaces one it would not by the inputs its shape is
broadcast from).

A ``where`` folds only when its taken branch has the where's static spec
(``taken_branch``), as in the cluster's fold. With unknown dims the two
branches could still differ at run time, a dim of 1 in the taken branch
against n in the other, which the where would broadcast: the folded plan
hands on the taken branch's own shape there. Checking that would need the
other branch's shape, which for batch norm's training branch means running
it; the branches of a training switch compute one tensor two ways.

Treating ``0 * y`` and ``0 / y`` as 0 differs from running it only where ``y`` is infinite
or NaN, or ``y`` is 0 (IEEE gives NaN), as it does in the cluster's fold, which leaves the
untaken branch out before the gradients are built.

Examples
--------
>>> import numpy as np
>>> import cellgraph as cg
>>> g = cg.Graph()
>>> with g.as_default():
...     x = cg.placeholder((None,), "float32", name="x")
...     training = cg.layers.training_switch()
...     y = cg.where(training, x * 2.0, cg.sqrt(x), name="y")
>>> sess = cg.Session(g)
>>> [n.op for n in sess.make_callable([y], [x]).order]  # no Sqrt, no Where
['Const', 'Mul']
>>> sess.run(y, {x: [4.0], training: False})  # fed, the switch is a value like any other
array([2.], dtype=float32)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from .graph import Node, Tensor
from .opdef import Shape

Key = tuple[int, int]


def _key(t: Tensor) -> Key:
    return (id(t.node), t.index)


def is_training_switch(node: Node) -> bool:
    """A scalar bool ``placeholder_with_default`` (``cg.layers.training_switch()``): false at inference."""
    return node.op == "PlaceholderWithDefault" and node.outputs[0].dtype == "bool" and node.outputs[0].shape == ()


def taken_branch(node: Node, is_fed: Callable[[Tensor], bool]) -> Tensor | None:
    """The input ``node`` passes on when it is a ``Where`` whose condition is an unfed scalar bool
    ``PlaceholderWithDefault`` with a constant default (a training switch), else None.

    A branch that the ``where`` broadcasts (its spec differs from the output's) is never taken
    in its place: its consumers need the full shape.
    """
    if node.op != "Where" or len(node.inputs) != 3:
        return None
    condition = node.inputs[0]
    switch = condition.node
    if switch.op != "PlaceholderWithDefault" or is_fed(condition) or condition.shape != ():
        return None
    default = switch.inputs[0].node
    if default.op != "Const":
        return None
    value = np.asarray(default.attrs["value"])
    if value.shape != () or value.dtype != np.bool_:
        return None
    branch = node.inputs[1] if bool(value) else node.inputs[2]
    return branch if branch.spec == node.output(0).spec else None


def cannot_stretch(operand: Shape, target: Shape) -> bool:
    """Broadcasting ``operand`` against ``target`` leaves ``target``'s shape as it is, whatever the
    run-time sizes of unknown dims: each of ``operand``'s dims (right-aligned) is a known 1 or equals
    a known dim of ``target``."""
    if len(operand) > len(target):
        return False
    tail = target[len(target) - len(operand) :]
    return all(d == 1 or (d is not None and d == t) for d, t in zip(operand, tail, strict=True))


def keep_shape(x: np.ndarray, *shaped: np.ndarray) -> np.ndarray:
    """``x + zeros(s)``, ``s`` the broadcast shape of ``shaped``, without the add: ``x`` itself unless
    the zeros broadcast it larger."""
    shape = np.broadcast_shapes(x.shape, *(a.shape for a in shaped))
    return x if shape == x.shape else np.broadcast_to(x, shape).copy()


# A known-zero tensor -> tensors whose broadcast shape is its run-time shape.
Zeros = dict[Key, tuple[Tensor, ...]]
# A rule gets a node's (folded) inputs and the zeros found so far, and gives the tensors that shape the
# node's output when that output is all zeros, else None.
ZeroRule = Callable[[Sequence[Tensor], Zeros], tuple[Tensor, ...] | None]


def _same_shape(ins: Sequence[Tensor], zeros: Zeros) -> tuple[Tensor, ...] | None:
    return zeros.get(_key(ins[0]))


def _sum_to_shape(ins: Sequence[Tensor], zeros: Zeros) -> tuple[Tensor, ...] | None:
    return (ins[1],) if _key(ins[0]) in zeros else None  # SumToShapeOf(g, like) has like's shape


def _product(ins: Sequence[Tensor], zeros: Zeros) -> tuple[Tensor, ...] | None:
    for zero, other in ((ins[0], ins[1]), (ins[1], ins[0])):
        if _key(zero) in zeros:
            return (*zeros[_key(zero)], other)
    return None


def _quotient(ins: Sequence[Tensor], zeros: Zeros) -> tuple[Tensor, ...] | None:
    return (*zeros[_key(ins[0])], ins[1]) if _key(ins[0]) in zeros else None  # 0 / y, a gradient through y


def _sum(ins: Sequence[Tensor], zeros: Zeros) -> tuple[Tensor, ...] | None:
    if not all(_key(t) in zeros for t in ins):
        return None  # one zero operand: fold() turns the add into the other operand
    return tuple(s for t in ins for s in zeros[_key(t)])


# The ops of a backward pass through which zeros stay zeros: each is linear in the operand its rule reads.
_ZERO_RULES: dict[str, ZeroRule] = {
    "Neg":          _same_shape,
    "Identity":     _same_shape,
    "SumToShapeOf": _sum_to_shape,
    "Mul":          _product,
    "Div":          _quotient,
    "Add":          _sum,
}  # fmt: skip


@dataclass
class Folding:
    """What a plan runs instead: tensors replaced by others, and adds of zeros kept as ``keep_shape``."""

    replaced: dict[Key, Tensor] = field(default_factory=dict)
    # An Add's node id -> (its non-zero operand, tensors whose broadcast shape is its zero operand's).
    guarded: dict[int, tuple[Tensor, tuple[Tensor, ...]]] = field(default_factory=dict)

    def resolve(self, t: Tensor) -> Tensor:
        """The tensor that holds ``t``'s value in the plan (``t`` itself unless folded away)."""
        return self.replaced.get(_key(t), t)

    def reads(self, node: Node) -> list[Tensor]:
        """The tensors ``node``'s step reads."""
        guard = self.guarded.get(id(node))
        return [guard[0], *guard[1]] if guard is not None else [self.resolve(t) for t in node.inputs]

    def operands(self, node: Node) -> list[Tensor]:
        """``reads`` without the shape tensors of guarded adds (to schedule before ``settle``)."""
        guard = self.guarded.get(id(node))
        return [guard[0]] if guard is not None else self.reads(node)

    def controls(self, node: Node) -> list[Node]:
        """The nodes ``node`` waits for: a folded node (it has no state) stands for the node computing
        its value (``gradients_ready`` waits for every gradient, some of them folded adds)."""
        waits = []
        for c in node.control_inputs:
            replaced = len(c.specs) == 1 and _key(c.output(0)) in self.replaced
            waits.append(self.resolve(c.output(0)).node if replaced else c)
        return waits

    def settle(self, computed: set[int], fed: set[Key]) -> None:
        """Shape each guarded add's zeros by tensors the plan computes anyway (nodes ``computed``,
        tensors ``fed``, or nodes without inputs): a tensor it would compute only for that shape is
        replaced by its node's inputs where the node is elementwise (its shape is their broadcast)."""
        for node_id, (x, shaped) in self.guarded.items():
            kept: dict[Key, Tensor] = {}
            stack = list(shaped)
            while stack:
                t = self.resolve(stack.pop())
                node = t.node
                if _key(t) in kept:
                    continue
                available = id(node) in computed or _key(t) in fed or not node.inputs
                if not available and node.opdef.elementwise is not None and len(node.specs) == 1:
                    stack.extend(node.inputs)
                else:
                    kept[_key(t)] = t
            # A tensor whose static shape cannot stretch x's needs no run-time look.
            self.guarded[node_id] = (x, tuple(t for t in kept.values() if not cannot_stretch(t.shape, x.shape)))

    def __bool__(self) -> bool:
        return bool(self.replaced or self.guarded)


def fold(order: Sequence[Node], fed: set[Key], guard: bool = True) -> Folding:
    """The folding of the nodes ``order`` (topological, as ``schedule`` gives them) for feeds ``fed``.

    A fed tensor, a node with control inputs (its dependencies must still run)
    and a node of several outputs are never folded. An add of zeros becomes
    its other operand where the shapes prove that the zeros do not broadcast
    it larger, else (with ``guard``) ``keep_shape`` of it; without ``guard``
    only where proven (``keep_shape`` takes NumPy arrays; a GPU plan's are
    device arrays).
    """
    folding = Folding()
    zeros: Zeros = {}
    same = _SameShape(folding)
    for node in order:
        if len(node.specs) != 1 or node.control_inputs or _key(node.output(0)) in fed:
            continue
        same.note(node)
        out = node.output(0)
        branch = taken_branch(node, lambda t: _key(t) in fed)
        if branch is not None:
            _fold_where(node, folding.resolve(branch), zeros, folding)
            continue
        rule = _ZERO_RULES.get(node.op)
        if rule is None:
            continue
        ins = [folding.resolve(t) for t in node.inputs]
        shaped = rule(ins, zeros)
        if shaped is not None:
            zeros[_key(out)] = shaped
        elif node.op == "Add":
            _fold_add(node, ins, zeros, folding, same, guard)
    return folding


# The ops whose output has the run-time shape of one input (its index), whatever the other holds.
_SHAPED_LIKE = {"SumToShapeOf": 1, "BroadcastLike": 1, "ZerosLike": 0, "OnesLike": 0}


class _SameShape:
    """Which tensors have one run-time shape: an elementwise op's output has the shape of an operand of
    its static shape that every other operand either cannot stretch or has the run-time shape of, and
    ``_SHAPED_LIKE``'s ops the shape of the input named, so each tensor leads back to a representative.
    Nodes are noted in topological order."""

    def __init__(self, folding: Folding) -> None:
        self.folding = folding
        self._of: dict[Key, Key] = {}

    def representative(self, t: Tensor) -> Key:
        key = _key(self.folding.resolve(t))
        return self._of.get(key, key)

    def note(self, node: Node) -> None:
        out = node.output(0)
        ins = [self.folding.resolve(u) for u in node.inputs]
        like = _SHAPED_LIKE.get(node.op)
        if like is not None:
            self._of[_key(out)] = self.representative(ins[like])
            return
        if node.opdef.elementwise is None or len(node.specs) != 1:
            return
        for u in ins:
            if u.shape == out.shape and all(
                v is u or cannot_stretch(v.shape, u.shape) or self.representative(v) == self.representative(u)
                for v in ins
            ):
                self._of[_key(out)] = self.representative(u)
                return

    def covers(self, x: Tensor, shaped: Sequence[Tensor]) -> bool:
        """Broadcasting ``x`` with ``shaped`` leaves ``x``'s run-time shape as it is: each cannot stretch it
        statically, or has ``x``'s run-time shape."""
        rep = self.representative(x)
        return all(cannot_stretch(s.shape, x.shape) or self.representative(s) == rep for s in shaped)


def _fold_where(node: Node, taken: Tensor, zeros: Zeros, folding: Folding) -> None:
    """``where(switch, a, b)`` as its taken branch (``taken_branch`` checked that it has the where's spec)."""
    folding.replaced[_key(node.output(0))] = taken
    if taken.node.op == "ZerosLike" and _key(taken) not in zeros:  # the untaken side of where's gradient
        zeros[_key(taken)] = (folding.resolve(taken.node.inputs[0]),)


def _fold_add(node: Node, ins: Sequence[Tensor], zeros: Zeros, folding: Folding, same: _SameShape, guard: bool) -> None:
    """``x + zeros``: ``x`` where the shapes prove it, else (with ``guard``) ``keep_shape``."""
    out = node.output(0)
    for zero, x in ((ins[0], ins[1]), (ins[1], ins[0])):
        if _key(zero) not in zeros or x.dtype != out.dtype:
            continue
        shaped = zeros[_key(zero)]
        if x.shape == out.shape and same.covers(x, shaped):
            folding.replaced[_key(out)] = x
        elif guard:
            folding.guarded[id(node)] = (x, shaped)
        return
