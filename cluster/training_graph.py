"""A loss and its gradients as plain data: what a replica rebuilds its executor from.

``prepare`` takes the user's loss, finds every trainable variable it depends
on, and builds ``cg.gradients`` for them on a copy of the graph (the user's
graph gets no extra nodes). It keeps only the nodes that the loss and the
gradients need, and returns a ``TrainingGraph``: that GraphDef as bytes plus the
names a replica feeds and fetches. Nothing in it is a pickled closure, so it
can cross a process boundary as-is. ``load`` turns it back into a graph, a
session and one compiled plan computing ``[loss, *gradients]``, to which the
variables' values are fed like the data (a replica's values come from the
parameter servers; the session's own variables are never read).

Examples
--------
>>> import numpy as np
>>> import cellgraph as cg
>>> from cellgraph.cluster.training_graph import load, prepare
>>> g = cg.Graph()
>>> with g.as_default():
...     x = cg.placeholder((None,), "float32", name="x")
...     w = cg.variable([2.0], name="w")
...     loss = cg.reduce_mean((x * w - x) ** 2.0, name="loss")
>>> tg = prepare(loss)
>>> tg.variables, tg.placeholders, tg.loss
(['w'], ['x:0'], 'loss:0')
>>> value, grads = load(tg).compute({"w": np.array([3.0], np.float32)}, [np.array([1.0, 2.0], np.float32)])
>>> value, grads["w"]
(10.0, array([10.], dtype=float32))
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cellgraph.dataflow.autodiff import gradients
from cellgraph.dataflow.devices import DeviceSpec
from cellgraph.dataflow.dtypes import is_float
from cellgraph.dataflow.errors import CellgraphError
from cellgraph.dataflow.executor import schedule
from cellgraph.dataflow.graph import Graph, Node, Tensor
from cellgraph.dataflow.graphdef import from_graphdef, to_graphdef
from cellgraph.dataflow.ops.normalization import MOVING_AVERAGE_MOMENTUM
from cellgraph.dataflow.ops.normalization import moving_average_input as average_input
from cellgraph.dataflow.session import Session, convert_feed
from cellgraph.dataflow.shapes import fmt
from cellgraph.protos import graph_pb2

from .training_switch import fold_switches


class TrainingError(CellgraphError):
    """A loss that cannot be trained as given (or data that does not fit it); the message says what to change."""


@dataclass(frozen=True)
class TrainingGraph:
    """A loss, its gradients and its variables' initial values, as plain data.

    ``graphdef`` is a serialized ``GraphDef`` holding exactly the nodes that the
    loss and the gradients need. ``gradients[i]`` is the gradient of ``loss``
    with respect to variable ``variables[i]``. ``placeholders`` are the tensors
    a replica feeds with data, in the order its data arrays come in.
    """

    graphdef: bytes
    loss: str
    variables: list[str]
    gradients: list[str]
    placeholders: list[str]
    initial: dict[str, np.ndarray]
    # Moving statistics (batch norm's moving mean and variance): variables the step updates in place but does
    # not train. ``state_values[i]`` is the value ``states[i]`` moves towards (a batch's mean or variance, or a
    # plain assignment's value), which a replica pushes, and ``state_momenta[i]`` how much of its own value it
    # keeps: the parameter servers set it to ``momentum * itself + (1 - momentum) * value`` (the mean of a sync
    # step's values), always from their current value, so that an async job's staleness cannot make it overshoot.
    states: list[str] = field(default_factory=list)
    state_values: list[str] = field(default_factory=list)
    state_momenta: list[float] = field(default_factory=list)
    # Where each of ``pulled`` is fed, when not at the variable itself: a placed step's worker partition receives
    # it at a Recv (``placed_training``).
    variable_feeds: list[str] | None = None
    # Held variables the step never reads, so never pulled: in a placed step, a moving statistic whose average
    # runs on its parameter server (batch norm in training reads only the batch's statistics).
    unread: list[str] = field(default_factory=list)

    @property
    def held(self) -> list[str]:
        """Every variable the parameter servers hold for this step: the trained ones, then the moving statistics."""
        return [*self.variables, *self.states]

    @property
    def pulled(self) -> list[str]:
        """The held variables a replica pulls and feeds to its step, in ``held``'s order."""
        return [name for name in self.held if name not in self.unread]

    def nbytes(self) -> int:
        """Bytes of the variables and moving statistics (what one pull or one push moves)."""
        return sum(int(value.nbytes) for value in self.initial.values())


def prepare(loss: Tensor, data_feeds: Sequence[Tensor] | None = None) -> TrainingGraph:
    """The ``TrainingGraph`` of ``loss``: gradients for every trainable variable it depends on.

    ``data_feeds`` are the tensors the data will be fed to, in the order of the
    data arrays; by default, every placeholder the loss needs, in the order
    the graph made them. The user's graph is left as it was.

    Raises ``TrainingError`` for a loss that is not a float scalar, depends on
    no trainable variable, or through which no gradient reaches one of its
    variables; for data feeds that leave a placeholder the loss needs unfed;
    and for a stale node on the way to the loss.
    """
    graph = loss.graph
    if loss not in graph:
        raise TrainingError(f"the loss {loss.name!r} was removed from its graph (its cell was re-run); use the new one")
    if loss.shape != () or not is_float(loss.dtype):
        raise TrainingError(
            f"the loss {loss.name!r} is {fmt(loss.shape)} {loss.dtype}; a loss must be a float scalar: "
            "reduce it, e.g. cg.reduce_mean(...)"
        )
    feeds = list(data_feeds) if data_feeds is not None else None
    for t in feeds or []:
        if t not in graph:
            raise TrainingError(f"data feed {t.name!r} is not in the loss's graph (another graph, or a re-run cell)")

    # Gradients are built on a copy: nothing the user holds gains nodes, even when this fails halfway.
    # A replica never feeds a training switch: the branch its default does not take is left out of the step.
    copy = from_graphdef(fold_switches(to_graphdef(graph), fed={t.name for t in feeds or []}))
    loss_c = copy.tensor(loss.name)
    position = {node.name: i for i, node in enumerate(copy.nodes)}
    upstream = sorted(schedule([loss_c], [], []), key=lambda n: position[n.name])
    variables = [n for n in upstream if n.op == "Variable" and n.attrs.get("trainable", True)]
    if not variables:
        raise TrainingError(
            f"the loss {loss.name!r} depends on no trainable variable: there is nothing to train. "
            "Compute it from cg.variable(...)s (or mark them trainable=True)"
        )
    with copy.as_default():
        grads = gradients(loss_c, [v.output(0) for v in variables])
    missing = [v.name for v, g in zip(variables, grads) if g is None]
    if missing:
        raise TrainingError(
            f"no gradient flows from the loss {loss.name!r} to variable(s) {', '.join(map(repr, missing))}: "
            "every path to them goes through an op that is not differentiable (a comparison, argmax, a cast "
            "to int, ...). Make the path differentiable, or create them with trainable=False"
        )
    present = [g for g in grads if g is not None]
    states = _moving_statistics(upstream)
    fetched = [loss_c, *present, *(value for _, value, _ in states)]
    feed_tensors = [copy.tensor(t.name) for t in feeds] if feeds is not None else []
    # In the graph's order (gradient nodes, made last, at the end): placeholders come in the order they were made.
    needed = sorted(schedule(fetched, [], feed_tensors), key=lambda n: position.get(n.name, len(position)))
    _check_runnable(needed, loss.name)
    placeholders = _placeholders(needed, feeds, loss.name)
    # A fed tensor's own inputs stay too (the GraphDef must be whole), though they never run.
    kept = {n.name for n in schedule([*fetched, *feed_tensors], [], [])}
    full = to_graphdef(copy)
    pruned = graph_pb2.GraphDef(versions=full.versions)
    pruned.node.extend(node for node in full.node if node.name in kept)
    return TrainingGraph(
        graphdef=pruned.SerializeToString(deterministic=True),
        loss=loss.name,
        variables=[v.name for v in variables],
        gradients=[g.name for g in present],
        placeholders=placeholders,
        initial={v.name: _initial_value(v) for v in [*variables, *(var for var, _, _ in states)]},
        states=[var.name for var, _, _ in states],
        state_values=[value.name for _, value, _ in states],
        state_momenta=[momentum for _, _, momentum in states],
    )


def _moving_statistics(upstream: list[Node]) -> list[tuple[Node, Tensor, float]]:
    """The untrained variables that the step assigns (batch norm's moving statistics), each with the value it
    moves towards and its momentum (0 for a plain assignment: it takes the value).

    Any other in-place update of an untrained variable on the way to the loss is refused: a replica could only
    apply it to its own copy, which no other replica and no parameter server would see.
    """
    found: list[tuple[Node, Tensor, float]] = []
    for node in upstream:
        if not (node.opdef.stateful and node.inputs and node.inputs[0].node.op == "Variable"):
            continue
        target = node.inputs[0].node
        if target.attrs.get("trainable", True):
            continue
        if node.op != "Assign":
            raise TrainingError(
                f"{node.describe()} updates the untrained variable {target.name!r} in place on the way to the loss; "
                "a cluster job can carry assigned values (batch norm's moving statistics) to the parameter "
                "servers, not other in-place updates: compute it outside the loss"
            )
        if any(var is target for var, _, _ in found):
            raise TrainingError(f"variable {target.name!r} is assigned twice in one step ({node.describe()})")
        if MOVING_AVERAGE_MOMENTUM in node.attrs:
            found.append((target, moving_average_input(node), float(node.attrs[MOVING_AVERAGE_MOMENTUM])))
        else:
            found.append((target, node.inputs[1], 0.0))
    return found


def moving_average_input(assign: Node) -> Tensor:
    """The value a moving average's assignment moves its variable towards (``stat`` in batch norm's
    ``var * momentum + stat * (1 - momentum)``, the Add of two Muls that ``batch_norm`` builds)."""
    stat = average_input(assign)
    if stat is not None:
        return stat
    average = assign.inputs[1].node
    raise TrainingError(
        f"{assign.describe()} is marked as a moving average of variable {assign.inputs[0].node.name!r}, but its "
        f"value comes from {average.op} '{average.name}', not from `var * momentum + stat * (1 - momentum)`; "
        "a batch norm whose training switch is fed with data cannot train on a cluster: leave the switch unfed"
    )


def _initial_value(node: Node) -> np.ndarray:
    # The same array a fresh Session would start from (VariableStore.value).
    return np.array(node.attrs["initial_value"], dtype=node.specs[0].dtype, copy=True)


def _check_runnable(needed: list[Node], loss: str) -> None:
    stale = [n for n in needed if n.stale]
    if stale:
        node = stale[0]
        cell = node.cell_label or node.cell
        again = f"re-run cell {cell}" if cell is not None else "rebuild it"
        raise TrainingError(f"the loss {loss!r} needs {node.describe()}, which is stale: {node.stale}; {again}")


def _placeholders(needed: list[Node], feeds: list[Tensor] | None, loss: str) -> list[str]:
    """The data feeds' names, checked to leave no placeholder that the loss needs unfed."""
    unfed = [n.output(0).name for n in needed if n.op == "Placeholder"]
    if feeds is None:
        return unfed
    if unfed:
        raise TrainingError(
            f"the loss {loss!r} needs placeholder(s) {', '.join(map(repr, unfed))} that get no data "
            f"(the data feeds: {', '.join(repr(t.name) for t in feeds) or 'none'}); give data for them"
        )
    return [t.name for t in feeds]


@dataclass
class LoadedGraph:
    """A ``TrainingGraph`` rebuilt in this process: the graph, a session and its tensors."""

    graph: Graph
    session: Session
    loss: Tensor
    variables: list[Tensor]
    gradients: list[Tensor]
    placeholders: list[Tensor]
    names: list[str]  # what the step pushes: the trained variables, then the moving statistics
    fed: list[str]  # the names of ``variables``, the pulled values fed to the step
    state_values: list[Tensor] = field(default_factory=list)  # the value each moving statistic moves towards

    def __post_init__(self) -> None:
        # Variables are fed like data: the values pulled from the PS go straight to
        # the kernels, with no copy into the session's variables (measured cheaper).
        # Gradients are fetched last variable first: the plan runs its fetches' subgraphs in that order, so the
        # output layer's gradients are computed (and, streamed, sent) while backprop goes on to the first layer's.
        fetched = [*self.gradients[::-1], *self.state_values]
        feeds = [*self.variables, *self.placeholders]
        self._run: Any = (
            DeviceRun(self.graph, [self.loss, *fetched], feeds, seed=self.session.variables.seed)
            if any(is_gpu(node.device) for node in self.graph.nodes)
            else self.session.make_callable([self.loss, *fetched], feeds)
        )
        trained = self.names[: len(self.gradients)]
        self._fetched_names = [*trained[::-1], *self.names[len(self.gradients) :]]
        self._states = set(self.names[len(self.gradients) :]) & set(self.fed)
        self._shapes = [tuple(d for d in t.shape if d is not None) for t in self.variables]  # always known

    def convert(self, data: Sequence[Any]) -> list[np.ndarray]:
        """``data`` (one array per placeholder) checked and cast to the placeholders' dtypes."""
        if len(data) != len(self.placeholders):
            names = ", ".join(repr(t.name) for t in self.placeholders)
            raise TrainingError(f"got {len(data)} data array(s) for {len(self.placeholders)} placeholder(s) ({names})")
        arrays = []
        for t, value in zip(self.placeholders, data):
            try:
                arrays.append(convert_feed(t, value))
            except CellgraphError as err:
                raise TrainingError(f"data for placeholder {t.name!r}: {err}") from None
        rows = {t.name: len(a) if a.ndim else 0 for t, a in zip(self.placeholders, arrays)}
        if len(set(rows.values())) > 1:
            raise TrainingError(
                "data arrays must have the same number of rows, got "
                + ", ".join(f"{name}: {n}" for name, n in rows.items())
            )
        return arrays

    def compute(
        self,
        values: Mapping[str, np.ndarray],
        batch: Sequence[np.ndarray],
        on_gradient: Callable[[str, np.ndarray], None] | None = None,
        wait: Callable[[str], None] | None = None,
    ) -> tuple[float, dict[str, np.ndarray]]:
        """The loss and each variable's gradient for variable ``values`` and one ``batch``.

        ``values`` must have the variables' dtypes and shapes (as pulled from
        a parameter server); ``batch`` those of the placeholders (``convert``).
        ``on_gradient(name, gradient)`` is called the moment each gradient is
        computed, while backprop goes on (a replica sends it then). With
        ``wait``, ``values`` may still be arriving: ``wait(name)`` is called
        just before the first kernel that reads variable ``name`` (with
        ``on_gradient`` only).
        """
        if wait is not None:
            for name in self._states:  # copied below, before any kernel runs
                wait(name)
        # The parameter service hands a 0-d variable back with shape (1,) (np.ascontiguousarray in
        # ParameterClient.init makes it 1-d); reshape is a view, and free when the shape already fits.
        # A moving statistic is fed a copy (small): an unplaced graph's own assignment writes the new value into
        # the array fed for the variable, the replica's buffer that the next pull writes into.
        feeds = [
            (np.array(values[name]) if name in self._states else values[name]).reshape(shape)
            for name, shape in zip(self.fed, self._shapes)
        ]
        names = self._fetched_names

        if on_gradient is None:
            loss, *fetched = self._run(*feeds, *batch)
        else:

            def ready(i: int, value: np.ndarray) -> None:
                if i > 0:  # fetch 0 is the loss
                    on_gradient(names[i - 1], value)

            if wait is None:
                loss, *fetched = self._run.stream(ready, *feeds, *batch)
            else:
                variables = self.fed

                def before_use(i: int) -> None:
                    if i < len(variables):  # the feeds after the variables are the batch's, here already
                        wait(variables[i])

                loss, *fetched = self._run.stream_gated(ready, before_use, *feeds, *batch)
        return float(loss), dict(zip(names, fetched))


def is_gpu(device: str) -> bool:
    """Whether ``device`` (a node's device name, maybe empty) names a GPU."""
    return bool(device) and DeviceSpec.parse(device).device_type == "gpu"


# The worker's CPU, as the placement of a training step names it (every replica runs replica 0's partition).
WORKER_CPU = "/job:worker/task:0/device:cpu:0"


class DeviceRun:
    """The step of a worker graph placed across its CPU and GPU (``node.device``), run by a ``PartitionedSession``:
    tensors stay on the GPU between its ops, and are copied at the feeds (pulled values, the batch) and fetches.

    The same calls as a ``Session.make_callable`` plan. ``stream`` hands each fetch over as soon as it is
    computed: one computed on the GPU once its copy to the host has finished, on the copy stream, while the
    partition goes on launching the rest of the backward pass (``PartitionedSession.stream``). So a GPU replica
    sends each gradient while backprop goes on, as a CPU replica does.
    """

    def __init__(self, graph: Graph, fetches: list[Tensor], feeds: list[Tensor], seed: int | None = None) -> None:
        from cellgraph.dataflow.partitioned_session import PartitionedSession

        # A node with no device runs beside the others on the worker's CPU (the Recv of a pulled value is one).
        cpu = next((node.device for node in graph.nodes if node.device and not is_gpu(node.device)), WORKER_CPU)
        self.session = PartitionedSession(graph, {node.name: node.device or cpu for node in graph.nodes}, seed=seed)
        self.fetches, self.feeds = fetches, feeds

    def __call__(self, *values: Any) -> list[Any]:
        return list(self.session.run(self.fetches, dict(zip(self.feeds, values))))

    def stream(self, ready: Callable[[int, Any], None], *values: Any) -> list[Any]:
        """Run the step, calling ``ready(i, value)`` as each fetch is computed, one call at a time.

        The calls come from the partitions' threads and the GPU's sender
        thread: ``ready`` runs under a lock, and its first error (a push the
        parameter servers refused) is raised here, on the caller's thread,
        once the step has run; no fetch is handed over after it.
        """
        lock = threading.Lock()
        failed: list[BaseException] = []

        def handed(i: int, value: Any) -> None:
            with lock:
                if failed:
                    return
                try:
                    ready(i, value)
                except BaseException as error:  # noqa: BLE001 - raised on the caller's thread below
                    failed.append(error)

        fetched = self.session.stream(self.fetches, dict(zip(self.feeds, values)), handed)
        if failed:
            raise failed[0]
        return fetched

    def stream_gated(
        self, ready: Callable[[int, Any], None], before_use: Callable[[int], None], *values: Any
    ) -> list[Any]:
        for i in range(len(values)):  # every feed is read at once: wait for each pulled value first
            before_use(i)
        return self.stream(ready, *values)


def load(tg: TrainingGraph, seed: int | None = None) -> LoadedGraph:
    """Rebuild ``tg``'s graph (every node checked again by its shape rule) and compile its step.

    ``seed`` is the session's (``Session(graph, seed=...)``): each replica passes its own, so replicas draw
    different dropout masks, as one process does for the rows of one large batch.
    """
    graph = from_graphdef(graph_pb2.GraphDef.FromString(tg.graphdef))
    return LoadedGraph(
        graph=graph,
        session=Session(graph, seed=seed),
        loss=graph.tensor(tg.loss),
        variables=[graph.tensor(name) for name in tg.variable_feeds or [f"{v}:0" for v in tg.pulled]],
        gradients=[graph.tensor(name) for name in tg.gradients],
        placeholders=[graph.tensor(name) for name in tg.placeholders],
        names=tg.held,
        fed=tg.pulled,
        state_values=[graph.tensor(name) for name in tg.state_values],
    )


__all__ = ["LoadedGraph", "TrainingError", "TrainingGraph", "load", "prepare"]
