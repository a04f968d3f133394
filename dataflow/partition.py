"""Cutting a placed graph into one subgraph per device, joined by Send/Recv.

Every node is copied, under its own name, into the graph of the device the
placement gives it. An edge between devices becomes one Send on the producer's
device and one Recv on the consumer's, one pair per tensor per destination
device however many consumers it has there. A control dependency across
devices sends a scalar token. The original graph is not changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import PlacementError
from .graph import Graph, Node, Tensor
from .ops import transfer
from .ops.state import constant


@dataclass
class Edge:
    """One tensor crossing from ``src`` to ``dst``: its Send, its Recv, and who reads it."""

    tensor: Tensor
    src: str
    dst: str
    send: Node
    recv: Tensor
    consumers: set[str] = field(default_factory=set)
    # The original nodes whose completion the Send reports: the producer (or the control dependency a token
    # stands for), and the reader's control dependencies on the producer's device, which its value must follow.
    after: tuple[str, ...] = ()


@dataclass
class Partitioned:
    """The per-device subgraphs of ``graph`` and how they connect."""

    graph: Graph
    device_of: dict[str, str]
    graphs: dict[str, Graph]
    copies: dict[str, Node]  # original node name -> its copy in its device's graph
    edges: list[Edge]
    version: int

    def copy_of(self, t: Tensor) -> Tensor:
        return self.copies[t.node.name].output(t.index)

    def ranks(self, order: list[Node]) -> dict[int, float]:
        """Positions for every partition node, from one order of the whole graph.

        Each partition runs its nodes in this one global order, with a Send
        right after what it sends and a Recv right before its first reader.
        Then no two partitions can wait on each other: the earliest blocked
        Recv's Send comes earlier still, in a partition already past it.
        """
        rank = {node.name: float(i) for i, node in enumerate(order)}
        out: dict[int, float] = {id(self.copies[name]): r for name, r in rank.items()}
        for edge in self.edges:
            # What the whole order does not schedule is fed, so ready from the start.
            sent = max(rank.get(name, -1.0) for name in edge.after) + 0.5
            out[id(edge.send)] = sent
            source = id(edge.send.inputs[0].node)
            out[source] = min(out.get(source, sent - 0.25), sent - 0.25)
            readers = [rank[c] for c in edge.consumers if c in rank]
            out[id(edge.recv.node)] = (min(readers) if readers else sent + 1.0) - 0.5
        return out


def _devices_of(graph: Graph, placement: Any) -> dict[str, str]:
    device_of: Mapping[str, str] = getattr(placement, "device_of", placement)
    missing = [n.name for n in graph.nodes if n.name not in device_of]
    if missing:
        shown = ", ".join(repr(m) for m in missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise PlacementError(f"the placement gives no device for {shown}; place the graph again after changing it")
    return {n.name: device_of[n.name] for n in graph.nodes}


def _last_on(device: str, starts: list[Node], device_of: Mapping[str, str]) -> list[Node]:
    """The stateful nodes on ``device`` (updates) that ``starts`` wait for, directly or through other nodes.

    A walk up from ``starts`` stops at each stateful node on ``device``: what
    that node waits for there, it has already waited for. So a reader under a
    control dependency on a third device's node, which follows an update of
    the variable, is sent the variable's value after that update too. Only
    state orders a read: a pure node (a fed placeholder, say, which a Send
    must never run) is walked through, not waited for.
    """
    found: dict[str, Node] = {}
    seen: set[str] = set()
    stack = list(starts)
    while stack:
        node = stack.pop()
        if node.name in seen:
            continue
        seen.add(node.name)
        if device_of[node.name] == device and node.opdef.stateful:
            found[node.name] = node
            continue
        stack.extend(t.node for t in node.inputs)
        stack.extend(node.control_inputs)
    return list(found.values())


def partition(
    graph: Graph, placement: Any, timeout: float = transfer.DEFAULT_TIMEOUT_S, reads_wait: bool = True
) -> Partitioned:
    """One graph per device of ``placement`` (a ``Placement`` or a node name -> device dict).

    ``reads_wait``: a reader whose control dependencies wait for nodes on the producer's device, directly or
    through other devices, gets the value sent after those nodes, as a run on one device reads it (a cluster
    step, which pulls each variable once at its start, says False).

    Examples
    --------
    >>> import cellgraph as cg
    >>> g = cg.Graph()
    >>> with g.as_default():
    ...     w = cg.variable([1.0, 2.0], name="w")
    ...     y = cg.reduce_sum(w * 3.0, name="y")
    >>> ps, worker = "/job:ps/task:0/device:cpu:0", "/job:worker/task:0/device:cpu:0"
    >>> parts = cg.partition(g, {n.name: ps if n.name == "w" else worker for n in g.nodes})
    >>> sorted(n.op for n in parts.graphs[ps].nodes)
    ['Send', 'Variable']
    """
    from .executor import schedule

    device_of = _devices_of(graph, placement)
    graphs: dict[str, Graph] = {d: Graph() for d in dict.fromkeys(device_of.values())}
    copies: dict[str, Node] = {}
    edges: dict[tuple[str, str], Edge] = {}

    def local(t: Tensor, dst: str, consumer: Node) -> Tensor:
        src = device_of[t.node.name]
        if src == dst:
            return copies[t.node.name].output(t.index)
        # A reader that must run after nodes on the producer's device (an update of the variable it reads, say),
        # directly or through other devices' nodes, gets a value sent after them, as a one-device run reads it
        # then: a Send of its own, which waits for them. Other readers share the Send that follows the producer.
        waits = tuple(sorted(n.name for n in _last_on(src, consumer.control_inputs, device_of))) if reads_wait else ()
        key = f"{t.name}->{dst}" + (f"^{','.join(waits)}" if waits else "")
        edge = edges.get((key, dst))
        if edge is None:
            with graphs[src].control_dependencies([copies[name] for name in waits]):
                sent = transfer.send(copies[t.node.name].output(t.index), key, src, dst, graphs[src])
            received = transfer.recv(t.spec, key, src, dst, graphs[dst], timeout)
            edge = edges[(key, dst)] = Edge(t, src, dst, sent, received, after=(t.node.name, *waits))
        edge.consumers.add(consumer.name)
        return edge.recv

    def local_control(dep: Node, dst: str, consumer: str) -> Node:
        src = device_of[dep.name]
        if src == dst:
            return copies[dep.name]
        key = f"^{dep.name}->{dst}"
        edge = edges.get((f"^{dep.name}", dst))
        if edge is None:
            with graphs[src].control_dependencies([copies[dep.name]]):
                token = constant(0, dtype="int32", name=f"token/{dep.name}", graph=graphs[src])
            sent = transfer.send(token, key, src, dst, graphs[src])
            received = transfer.recv(token.spec, key, src, dst, graphs[dst], timeout)
            edge = edges[(f"^{dep.name}", dst)] = Edge(token, src, dst, sent, received, after=(dep.name,))
        edge.consumers.add(consumer)
        return edge.recv.node

    everything = [n for n in graph.nodes]
    for node in schedule([], everything, []):
        dst = device_of[node.name]
        g = graphs[dst]
        inputs = [local(t, dst, node) for t in node.inputs]
        controls = [local_control(c, dst, node.name) for c in node.control_inputs]
        with g.control_dependencies(controls):
            copy = g.create_node(node.op, inputs, dict(node.attrs), node.name)
        if copy.name != node.name:
            raise PlacementError(f"cannot partition: node name {node.name!r} collides with a Send/Recv name")
        copy.device, copy.cell, copy.cell_label, copy.line, copy.file = (
            dst,
            node.cell,
            node.cell_label,
            node.line,
            node.file,
        )
        copy.stale = node.stale
        copies[node.name] = copy
    return Partitioned(graph, device_of, graphs, copies, list(edges.values()), graph.version)
