"""``Session``: runs fetches of a graph with feeds, holding its variables' values."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from .errors import GraphError
from .executor import Plan
from .feeds import convert_feed
from .graph import Graph, Node, Tensor, get_default_graph
from .variables import VariableStore

Fetch = Tensor | Node | str


def checked_seed(seed: object, who: str) -> int | None:
    """``seed`` if it is None or an int, else a GraphError naming ``who``."""
    if seed is None or (isinstance(seed, (int, np.integer)) and not isinstance(seed, bool)):
        return None if seed is None else int(seed)
    raise GraphError(f"{who}: seed must be an int or None, got {seed!r}")


class Session:
    """Runs parts of one graph; owns the values of that graph's variables.

    Examples
    --------
    >>> import cellgraph as cg
    >>> g = cg.Graph()
    >>> with g.as_default():
    ...     x = cg.placeholder((None,), "float32", name="x")
    ...     y = x * 2.0
    >>> cg.Session(g).run(y, {x: [1.0, 2.0]})
    array([2., 4.], dtype=float32)
    """

    def __init__(self, graph: Graph | None = None, fuse: bool = True, *, seed: int | None = None) -> None:
        """``seed``, when given, is mixed into every random op's own seed: sessions of different seeds draw
        different dropout masks (each replica of a job has its own); without it every new session of the graph
        draws the same sequence."""
        self.graph = graph if graph is not None else get_default_graph()
        # Fuse runs of elementwise ops into one loop (dataflow/fusion.py).
        self.fuse = fuse
        self.variables = VariableStore(checked_seed(seed, "Session"))
        self._plans: dict[tuple[Any, ...], Plan] = {}

    def run(self, fetches: Any, feed_dict: Mapping[Tensor | str, Any] | None = None) -> Any:
        """Compute ``fetches`` (a tensor, node, name, or a list/tuple/dict of them).

        Returns the same structure with NumPy arrays (None for nodes). Every
        feed is checked before any kernel runs, so a bad feed changes nothing.
        """
        flat: list[Fetch] = []
        rebuild = flatten_fetches(fetches, flat)
        feeds = dict(feed_dict or {})
        feed_tensors = sorted((feed_tensor(self.graph, k) for k in feeds), key=lambda t: t.name)
        by_tensor = {feed_tensor(self.graph, k): v for k, v in feeds.items()}
        values = [convert_feed(t, by_tensor[t]) for t in feed_tensors]
        plan = self._plan(flat, feed_tensors)
        results = iter(plan(*values))
        out = [None if isinstance(resolve_fetch(self.graph, f), Node) else next(results) for f in flat]
        return rebuild(iter(out))

    def make_callable(self, fetches: Sequence[Fetch], feed_list: Sequence[Tensor] = ()) -> Plan:
        """A function of the feed arrays (in ``feed_list`` order) returning the fetched
        tensors, skipping ``run``'s per-call checks; for tight training loops (its
        ``stream`` also hands each fetch over the moment it is computed)."""
        feeds = [feed_tensor(self.graph, t) for t in feed_list]
        return self._plan(list(fetches), feeds, sort=False)

    def variable_values(self) -> dict[str, np.ndarray]:
        """Current values of every variable of the graph, by name (initialising any not yet used)."""
        self.variables.sync(self.graph)
        return {n.name: self.variables.value(n).copy() for n in self.graph.variables()}

    def _plan(self, flat: Sequence[Fetch], feeds: Sequence[Tensor], sort: bool = True) -> Plan:
        self.variables.sync(self.graph)
        resolved = [resolve_fetch(self.graph, f) for f in flat]
        tensors = [r for r in resolved if isinstance(r, Tensor)]
        targets = [r for r in resolved if isinstance(r, Node)]
        key = (self.graph.version, tuple(id(r) for r in resolved), tuple(id(t) for t in feeds))
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) > 256:  # a loop building fetches anew must not grow without bound
                self._plans.clear()
            plan = self._plans[key] = Plan(self.graph, tensors, targets, feeds, self.variables, fuse=self.fuse)
        return plan


def resolve_fetch(graph: Graph, fetch: Fetch) -> Tensor | Node:
    """The tensor or node of ``graph`` that ``fetch`` (a handle or a name) means."""
    if isinstance(fetch, str):
        if ":" in fetch:
            return graph.tensor(fetch)
        node = graph.node(fetch)
        # A node's name means its value where it has one (as graph.tensor reads it),
        # the node itself (run, fetched as None) where it has none, and is ambiguous
        # where it has several.
        if len(node.specs) == 1:
            return node.output(0)
        if len(node.specs) > 1:
            names = ", ".join(repr(f"{fetch}:{i}") for i in range(len(node.specs)))
            raise GraphError(
                f"fetch {fetch!r} is ambiguous: {node.describe()} has {len(node.specs)} outputs; fetch one of {names}"
            )
        return node
    if isinstance(fetch, (Tensor, Node)):
        if fetch not in graph:
            raise GraphError(
                f"fetch {fetch.name!r} is not in this session's graph (another graph, or its cell was re-run)"
            )
        return fetch
    raise GraphError(f"cannot fetch {fetch!r}: fetch a Tensor, a node, or a name")


def feed_tensor(graph: Graph, key: Tensor | str) -> Tensor:
    """The tensor of ``graph`` that feed key ``key`` (a handle or a name) means."""
    t = graph.tensor(key) if isinstance(key, str) else key
    if not isinstance(t, Tensor):
        raise GraphError(f"feed key {key!r} is not a Tensor")
    if t not in graph:
        raise GraphError(f"feed {t.name!r} is not in this session's graph (another graph, or its cell was re-run)")
    return t


def flatten_fetches(fetches: Any, flat: list[Fetch]) -> Callable[[Iterator[Any]], Any]:
    """Collect the leaves of a fetch structure; return how to rebuild it from results."""
    if isinstance(fetches, (list, tuple)):
        parts = [flatten_fetches(f, flat) for f in fetches]
        kind = list if isinstance(fetches, list) else tuple
        return lambda it: kind(part(it) for part in parts)
    if isinstance(fetches, Mapping):
        keyed = [(k, flatten_fetches(v, flat)) for k, v in fetches.items()]
        return lambda it: {k: part(it) for k, part in keyed}
    flat.append(fetches)
    return lambda it: next(it)
