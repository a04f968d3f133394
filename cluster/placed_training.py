"""A training step placed on a cluster and cut into what each device runs: one model of distribution.

``place_training`` takes a ``TrainingGraph`` (the loss and its gradients) and
builds the whole step as one graph: the optimizer's update op for every
variable, with its slots, beside the gradients. It places that graph with
``cg.placement.place`` on the cluster's devices (the user's ``with
cg.device(...)`` scopes honoured: a variable pinned to ``/job:ps/task:1`` lives
on shard 1) and partitions it with ``cg.partition``:

- the ``ps`` partitions hold the variables, their slots and their update ops:
  the parameter service's shard layout is the placement's
  (``ParameterClient.init(placement=...)``), and each shard applies the same
  optimizer entry the update op names;
- the worker partition is what every replica runs, on its own worker. Its Recv
  of a variable is the replica's pull of it (the pulled value is fed to the
  Recv's tensor), and its Send of a gradient is the push (the gradient is
  fetched and streamed to the shard as soon as backprop makes it).

So ``job.placement`` is exactly what runs. On a cluster whose training
workers each have a GPU (``worker_gpu``), the worker's ops that have a CUDA
kernel are placed on its ``/device:gpu:0`` and the rest on its CPU; the worker
partition keeps each node's device, and the replica runs it across the two
(tensors stay on the GPU between its ops; pulled values are copied in and
gradients out). Without one, replicas run on CPU (a GPU scope falls back to
CPU, with the placement's warning and reason). Compute that a ``ps`` scope
covers runs on the worker, its reason saying so: parameter servers hold
variables and apply their updates, nothing else.

Examples
--------
>>> import cellgraph as cg
>>> from cellgraph.cluster.ps import OptimizerConfig
>>> from cellgraph.cluster.training_graph import prepare
>>> g = cg.Graph()
>>> with g.as_default():
...     x = cg.placeholder((None, 2), "float32", name="x")
...     with cg.device("/job:ps/task:1"):
...         w = cg.variable([[1.0], [2.0]], name="w")
...     b = cg.variable([0.5], name="b")
...     loss = cg.reduce_mean(cg.matmul(x, w) + b, name="loss")
>>> placed = place_training(prepare(loss), OptimizerConfig("momentum", 0.1), ps_tasks=2)
>>> placed.placement.device_of["w"], placed.placement.device_of["w/momentum"]
('/job:ps/task:1/device:cpu:0', '/job:ps/task:1/device:cpu:0')
>>> placed.placement.device_of["loss"]
'/job:worker/task:0/device:cpu:0'
>>> sorted(placed.pulls)  # the worker partition's Recv of each variable
['b', 'w']
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from cellgraph.dataflow.devices import DeviceSpec
from cellgraph.dataflow.graph import Graph, Node, Tensor
from cellgraph.dataflow.graphdef import from_graphdef, to_graphdef
from cellgraph.dataflow.ops.normalization import MOVING_AVERAGE_MOMENTUM
from cellgraph.dataflow.ops.state import constant, variable
from cellgraph.dataflow.ops.training import apply_optimizer
from cellgraph.dataflow.optimizer_registry import OPTIMIZER_KINDS
from cellgraph.dataflow.partition import partition
from cellgraph.dataflow.placement import Placement, place
from cellgraph.protos import graph_pb2

from .ps import OptimizerConfig
from .ps.updates import STEP_COUNT_DTYPE
from .training_graph import WORKER_CPU, TrainingError, TrainingGraph, moving_average_input

# Every replica runs the worker partition on its own worker: the placement names replica 0's (its CPU is
# training_graph.WORKER_CPU).
WORKER_GPU = "/job:worker/task:0/device:gpu:0"
# The name scope of the update ops this module adds to the step graph.
UPDATE_SCOPE = "update"


@dataclass(frozen=True)
class PlacedTraining:
    """One training step placed and partitioned.

    ``graph`` is the whole step (loss, gradients, update ops, slots) and
    ``placement`` places every node of it. ``worker`` is the worker partition
    as the ``TrainingGraph`` a replica loads: its variables are fed at their
    Recv tensors (``pulls``: variable -> Recv tensor name) and its gradients
    (``pushes``: variable -> gradient tensor name) are what its Sends carry to
    the ``ps`` tasks.
    """

    graph: Graph
    placement: Placement
    worker: TrainingGraph
    pulls: dict[str, str]
    pushes: dict[str, str]


def place_training(
    tg: TrainingGraph, optimizer: OptimizerConfig, ps_tasks: int, strategy: str = "greedy", worker_gpu: bool = False
) -> PlacedTraining:
    """Place ``tg``'s step, with ``optimizer``'s update ops, on ``ps_tasks`` ``ps`` tasks and one worker, and cut it.

    ``worker_gpu``: the worker has a GPU; its ops with a CUDA kernel go there.

    Raises ``PlacementError`` for a device scope the cluster cannot honour (a
    ``ps`` task it does not have).
    """
    if ps_tasks < 1:
        raise TrainingError(f"a cluster job needs at least one parameter server, got ps_tasks={ps_tasks}")
    graph = from_graphdef(graph_pb2.GraphDef.FromString(tg.graphdef))
    _replica_scopes(graph)
    frozen = _frozen_to_worker(graph, tg)
    updates = _add_updates(graph, tg, optimizer)
    devices = [f"/job:ps/task:{i}/device:cpu:0" for i in range(ps_tasks)] + [WORKER_CPU]
    placement = place(graph, devices + [WORKER_GPU] if worker_gpu else devices, strategy=strategy)
    _follow_updates(placement, updates)
    for name in frozen:
        placement.reasons[name] = (
            "untrained, and the step never assigns it: every replica keeps its initial value, as the parameter "
            "servers hold only what training changes"
        )
    _compute_to_worker(graph, placement, updates)
    _moving_averages_to_servers(graph, placement)
    # The cut between the worker and the servers: the worker's GPU ops are in its partition, with their device.
    on_gpu = {name for name, device in placement.device_of.items() if device == WORKER_GPU}
    cut = replace(placement, device_of={n: WORKER_CPU if n in on_gpu else d for n, d in placement.device_of.items()})
    # A replica pulls each variable once, at its step's start: one Recv each, whatever waits for what on a server.
    parts = partition(graph, cut, reads_wait=False)
    pulls: dict[str, str] = {}
    pushes: dict[str, str] = {}
    tokens: set[str] = set()
    pushed_for = {**dict(zip(tg.gradients, tg.variables)), **dict(zip(tg.state_values, tg.states))}
    for edge in parts.edges:
        if edge.dst == WORKER_CPU and edge.tensor.node.op == "Variable":
            pulls[edge.tensor.node.name] = edge.recv.name
        elif edge.dst == WORKER_CPU:
            # A control token: a moving statistic's assignment ran on its ps task (batch norm's output waits for
            # it). On a replica that assignment is the push of its change: the token's Recv is left out below.
            tokens.add(edge.recv.node.name)
        elif edge.tensor.name in pushed_for:
            pushes[pushed_for[edge.tensor.name]] = edge.tensor.name
        else:  # unreachable while prepare() refuses other in-place updates; never drop a value silently
            raise TrainingError(f"{edge.tensor.name!r} goes from the worker to {edge.dst}, where nothing takes it")
    worker_def = to_graphdef(parts.graphs[WORKER_CPU])
    kept = [node for node in worker_def.node if node.name not in tokens]
    for node in kept:
        node.control_input[:] = [dep for dep in node.control_input if dep not in tokens]
        node.device = WORKER_GPU if node.name in on_gpu else WORKER_CPU
    del worker_def.node[:]
    worker_def.node.extend(kept)
    unread = [name for name in tg.states if name not in pulls]  # averaged on their servers (see above)
    worker = replace(
        tg,
        graphdef=worker_def.SerializeToString(deterministic=True),
        variable_feeds=[pulls[name] for name in tg.held if name not in unread],
        unread=unread,
    )
    return PlacedTraining(graph, placement, worker, pulls, pushes)


def _replica_scopes(graph: Graph) -> None:
    """A scope naming a worker task means the replica's own worker: every replica runs the same partition."""
    for node in graph.nodes:
        if not node.device:
            continue
        spec = DeviceSpec.parse(node.device)
        if spec.job == "worker" and spec.task not in (None, 0):
            node.device = str(replace(spec, task=0))


def _frozen_to_worker(graph: Graph, tg: TrainingGraph) -> list[str]:
    """An untrained variable the step never assigns (a frozen layer, a mask) is kept by every replica.

    Its value never changes, so each replica's copy of its initial value is
    what a server would serve; placed on a ``ps`` task it would be a Recv that
    no pull feeds (the servers hold only trained variables and moving
    statistics), and the replica would fail at its first step.
    """
    held = set(tg.held)
    frozen = [node for node in graph.nodes if node.op == "Variable" and node.name not in held]
    for node in frozen:
        node.device = WORKER_CPU  # a user's ps scope too: no server holds it
    return [node.name for node in frozen]


def _add_updates(graph: Graph, tg: TrainingGraph, optimizer: OptimizerConfig) -> dict[str, list[str]]:
    """The optimizer's update op (and its slots and learning rate) for every variable; its nodes by variable."""
    definition = OPTIMIZER_KINDS.lookup(optimizer.kind)
    hyper = {h.name: getattr(optimizer, h.name) for h in definition.hyperparameters[1:]}
    rate = optimizer.learning_rate if isinstance(optimizer.learning_rate, int | float) else 0.0
    made: dict[str, list[str]] = {}
    with graph.as_default():
        for name, gradient in zip(tg.variables, tg.gradients):
            var: Tensor = graph.node(name).output(0)
            shape = tuple(d for d in var.shape if d is not None)
            # Named and typed as the parameter servers keep them: "w/momentum", and Adam's step count "w/t" in float64.
            slots = {
                s.name: variable(
                    np.zeros(() if s.scalar else shape, STEP_COUNT_DTYPE if s.scalar else var.dtype),
                    dtype=STEP_COUNT_DTYPE.name if s.scalar else var.dtype,
                    name=f"{name}/{s.name}",
                    trainable=False,
                )
                for s in definition.slots_for(hyper)  # a flag may add one (amsgrad's "vhat")
            }
            lr = constant(rate, dtype=var.dtype, name=f"{UPDATE_SCOPE}/{name}/learning_rate")
            grad = graph.tensor(gradient)
            update = apply_optimizer(optimizer.kind, var, slots, lr, grad, hyper, name=f"{UPDATE_SCOPE}/{name}/apply")
            made[name] = [lr.node.name, update.node.name]
    return made


def _compute_to_worker(graph: Graph, placement: Placement, updates: dict[str, list[str]]) -> None:
    """Compute that a ``ps`` scope covers (``with cg.device("/job:ps/task:1"): dense(...)``) runs on the worker.

    The scope places the layer's variables; parameter servers hold variables
    and apply their updates and run nothing else, as TensorFlow's
    ``replica_device_setter`` arranges it.
    """
    kept = {name for made in updates.values() for name in made}
    for node in graph.nodes:
        device = placement.device_of[node.name]
        if node.op == "Variable" or node.name in kept or DeviceSpec.parse(device).job != "ps":
            continue
        if node.opdef.stateful and node.inputs and node.inputs[0].node.op == "Variable":
            continue  # a moving statistic's assignment stays with it: the server adds the pushed change
        placement.device_of[node.name] = WORKER_CPU
        placement.reasons[node.name] = (
            f"{placement.reasons[node.name]}; on the replica's worker instead: parameter servers hold variables "
            "and apply their updates, compute runs where the replicas are"
        )


def _moving_averages_to_servers(graph: Graph, placement: Placement) -> None:
    """Batch norm's ``var * momentum + stat * (1 - momentum)`` runs with its assignment, on the variable's ``ps`` task.

    That is what the parameter server does with a pushed batch statistic: it
    moves the variable from its current value. So the worker's Send carries the
    statistic, and no replica computes the average from the value it pulled,
    which in an async job may be several updates old.
    """
    consumers: dict[str, set[str]] = {}
    for node in graph.nodes:
        for t in node.inputs:
            consumers.setdefault(t.node.name, set()).add(node.name)
    for assign in graph.nodes:
        if assign.op != "Assign" or MOVING_AVERAGE_MOMENTUM not in assign.attrs:
            continue
        stat = moving_average_input(assign)
        average = assign.inputs[1].node
        moved: list[Node] = [average, *(t.node for t in average.inputs)]
        constants = [t.node for mul in moved[1:] for t in mul.inputs if t.node.op == "Const"]
        names = {node.name for node in moved}
        moved += [c for c in constants if consumers.get(c.name, set()) <= names]
        device = placement.device_of[assign.name]
        for node in moved:
            placement.device_of[node.name] = device
            placement.reasons[node.name] = (
                f"moving average of '{assign.inputs[0].node.name}' towards '{stat.name}': its parameter server "
                "moves the variable from its current value"
            )


def _follow_updates(placement: Placement, updates: dict[str, list[str]]) -> None:
    """A variable's learning rate goes with its update op: the shard's own optimizer setting, not a worker's value."""
    for owner, (rate, op) in updates.items():
        device = placement.device_of[op]
        placement.device_of[rate] = device
        placement.reasons[rate] = f"learning rate of variable '{owner}''s update: held by its parameter server"
