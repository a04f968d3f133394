"""A replica's step with its training switches fixed: the branch a switch does not take is never built.

``cg.layers.training_switch()`` is a scalar bool ``PlaceholderWithDefault``
that dropout and batch norm take, so that one graph trains and evaluates: they
compute both modes and ``where(switch, ...)`` picks one. A replica never feeds
the switch (its data feeds are placeholders), so in its step the switch is its
default. ``fold_switches`` rewires every consumer of such a ``where`` to the
branch taken, before the gradients are built: the other branch, and its
backward pass, are left out of the step (a batch-norm network's step computed
both normalizations and back-propagated through both: 1.75 times the time).
Which ``where`` folds, and to which branch, is ``dataflow.switch_fold``'s rule,
the one a local plan follows; here it rewires the graph itself, so the
gradients built next never see the other branch.

Examples
--------
>>> import numpy as np
>>> import cellgraph as cg
>>> from cellgraph.dataflow.graphdef import from_graphdef, to_graphdef
>>> g = cg.Graph()
>>> with g.as_default():
...     x = cg.placeholder((None,), "float32", name="x")
...     training = cg.layers.training_switch()
...     y = cg.where(training, x * 2.0, x, name="y")
...     loss = cg.reduce_sum(y, name="loss")
>>> folded = from_graphdef(fold_switches(to_graphdef(g), fed=set()))
>>> [t.name for t in folded.node("loss").inputs]
['mul:0']
"""

from __future__ import annotations

from collections.abc import Collection

from cellgraph.dataflow.graphdef import from_graphdef
from cellgraph.dataflow.switch_fold import taken_branch
from cellgraph.protos import graph_pb2


def fold_switches(graphdef: graph_pb2.GraphDef, fed: Collection[str]) -> graph_pb2.GraphDef:
    """A copy of ``graphdef`` in which every ``where`` on an unfed scalar bool ``PlaceholderWithDefault`` with a
    constant default is replaced, for its consumers, by the branch that default takes (``fed``: tensor names
    fed with data, never folded)."""
    graph = from_graphdef(graphdef)
    taken: dict[str, str] = {}
    for node in graph.nodes:
        branch = taken_branch(node, lambda t: t.name in fed)
        if branch is not None:
            taken[node.output(0).name] = branch.name
    if not taken:
        return graphdef

    def resolve(name: str) -> str:
        while name in taken:  # a where whose branch is another folded where
            name = taken[name]
        return name

    out = graph_pb2.GraphDef()
    out.CopyFrom(graphdef)
    for proto in out.node:
        proto.input[:] = [resolve(name) for name in proto.input]
    return out
