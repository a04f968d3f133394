"""The inference graph of a trained model, and the trained values its variables hold.

Both the saved model (``cellgraph/saved_model.py``) and the ONNX exporter
(``cellgraph/onnx/``) start here: only the nodes the outputs need, training-only
ops switched to what they do at inference, and the variables' values read from
wherever training left them (a ``Session``, a running or finished ``Job``, a
parameter-server checkpoint folder, or a plain mapping).

Examples
--------
>>> import cellgraph as cg
>>> g = cg.Graph()
>>> with g.as_default():
...     x = cg.placeholder((None, 4), name="x")
...     y = cg.dropout(cg.layers.dense(x, 2, name="dense"), 0.5, name="drop")
...     loss = cg.reduce_sum(y, name="loss")
>>> model = inference_graph(x, y)
>>> [(n.name, n.op) for n in model.graph if n.op in ("Identity", "Dropout", "ReduceSum")]
[('drop', 'Identity')]
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cellgraph.dataflow.errors import CellgraphError
from cellgraph.dataflow.graph import Graph, Node, Tensor, name_scope
from cellgraph.dataflow.graphdef import dependency_order, from_graphdef, to_graphdef, to_tensor_proto
from cellgraph.dataflow.ops.math import cast
from cellgraph.dataflow.ops.normalization import moving_statistics, normalized
from cellgraph.dataflow.session import Session
from cellgraph.dataflow.switch_fold import is_training_switch
from cellgraph.protos import graph_pb2


class ExportError(CellgraphError):
    """A model cannot be written out (or read back) as asked: names the node, op or file."""


# A shard's manifest in a checkpoint folder; [0-9], not \d: the name is read from the folder, not trusted.
_MANIFEST = re.compile(r"shard-([0-9]+)-of-([0-9]+)\.json")


# Training-only ops and what each becomes at inference: one row per op. A rewrite
# gets the NodeDef and changes it in place; the node keeps its name, so
# consumers still find it.
def _dropout_to_identity(proto: graph_pb2.NodeDef) -> None:
    # Inference keeps every unit, unscaled: Dropout's output 0 becomes its input.
    proto.op = "Identity"
    proto.attr.clear()
    del proto.output[1:]


INFERENCE_REWRITES: dict[str, Callable[[graph_pb2.NodeDef], None]] = {
    "Dropout": _dropout_to_identity,
}


def _switch_to_false(proto: graph_pb2.NodeDef) -> None:
    # The switch is fixed off: a constant, so nothing upstream of its default is needed.
    proto.op = "Const"
    del proto.input[:]
    proto.attr.clear()
    proto.attr["value"].tensor.CopyFrom(to_tensor_proto(np.array(False)))


def _switched(node: Node, replaced: Mapping[str, str]) -> Tensor | None:
    """What a node that picks its training result gives at inference; None for any other node.

    Batch norm and dropout with a training switch pick their training or inference
    result with a ``where(training, a, b)``: it gives ``b``, and following only ``b``
    leaves the training branch (the batch statistics) out of the inference graph.
    A batch norm built with ``training=True`` has no such branch; ``replaced`` names
    the one made for it (``_with_moving_statistics``).
    """
    if node.op == "Where" and node.inputs[0].shape == () and is_training_switch(node.inputs[0].node):
        return node.inputs[2]
    if node.name in replaced:
        return node.graph.tensor(replaced[node.name])
    return None


@dataclass(frozen=True)
class InferenceGraph:
    """A pruned, inference-mode copy of a graph, with its inputs and outputs as tensor names."""

    graph: Graph
    inputs: list[str]
    outputs: list[str]

    def tensors(self, names: Sequence[str]) -> list[Tensor]:
        return [self.graph.tensor(n) for n in names]


def _as_tensor_list(values: Tensor | Sequence[Tensor], what: str) -> list[Tensor]:
    items = [values] if isinstance(values, Tensor) else list(values)
    if not items:
        raise ExportError(f"{what}: give at least one tensor")
    for t in items:
        if not isinstance(t, Tensor):
            raise ExportError(f"{what}: {t!r} is not a Tensor (give the model's tensors, e.g. model.x)")
    return items


def inference_graph(inputs: Tensor | Sequence[Tensor], outputs: Tensor | Sequence[Tensor]) -> InferenceGraph:
    """Only what ``outputs`` need from ``inputs``, with training-only ops rewritten for inference.

    A training switch (``cg.layers.training_switch()``) is fixed to False: it
    becomes a constant, and the Where nodes that pick batch norm's or dropout's
    training result by it give their inference input.

    Raises ``ExportError`` when an input is not a placeholder, when an output
    needs a placeholder that is not among the inputs, or when it needs an op
    that changes state (an optimizer step, an assignment).
    """
    ins = _as_tensor_list(inputs, "inputs")
    outs = _as_tensor_list(outputs, "outputs")
    graph = outs[0].graph
    for t in ins + outs:
        if t.graph is not graph:
            raise ExportError(f"tensor {t.name!r} belongs to another graph than output {outs[0].name!r}")
    for t in ins:
        if t.op != "Placeholder":
            raise ExportError(
                f"input {t.name!r} is made by {t.node.describe()}, not by a placeholder: "
                "a model's inputs are the placeholders it is fed through"
            )
    needed = _needed(graph, outs, {t.node for t in ins}, {})
    replaced: dict[str, str] = {}
    batch_statistics = [node for node in needed.values() if node.op == "FusedBatchNorm"]
    if batch_statistics:
        graph, ins, outs, replaced = _with_moving_statistics(graph, ins, outs, needed, batch_statistics)
        needed = _needed(graph, outs, {t.node for t in ins}, replaced)
    fed = {t.node.name for t in ins}
    for node in needed.values():
        if node.op == "Placeholder" and node.name not in fed:
            raise ExportError(
                f"output needs placeholder {node.describe()}, which is not among the inputs "
                f"({', '.join(sorted(fed))}): add it to inputs, or export an output that does not read it"
            )
    full = to_graphdef(graph)
    pruned = graph_pb2.GraphDef(versions=full.versions)
    for proto in full.node:
        if proto.name not in needed:
            continue
        node = needed[proto.name]
        rewrite = INFERENCE_REWRITES.get(proto.op)
        chosen = _switched(node, replaced)
        if chosen is not None:
            proto.op = "Identity"
            proto.attr.clear()
            del proto.input[:]
            del proto.output[1:]
            proto.input.append(chosen.name)
        elif is_training_switch(node):
            _switch_to_false(proto)
        elif rewrite is not None:
            rewrite(proto)
        elif node.opdef.stateful and node.op != "Variable":
            raise ExportError(
                f"output needs {node.describe()}, which changes state (training only); "
                "export the model's prediction tensors, not its training op"
            )
        # Control edges order training steps; inference has none. Devices belong to the cluster
        # that trained it. Cells and source lines stay: errors about a node point at its code.
        del proto.control_input[:]
        proto.removed_control_input.clear()
        proto.device = ""
        pruned.node.append(proto)
    if replaced:  # the twins were made last: put each before its readers, as an exporter walks the graph
        protos = {proto.name: proto for proto in pruned.node}
        ordered = [protos[name] for name in dependency_order(pruned)]
        del pruned.node[:]
        pruned.node.extend(ordered)
    try:
        built = from_graphdef(pruned)
    except CellgraphError as err:
        raise ExportError(f"the inference graph does not rebuild: {err}") from err
    return InferenceGraph(built, [t.name for t in ins], [t.name for t in outs])


def _with_moving_statistics(
    graph: Graph, ins: list[Tensor], outs: list[Tensor], needed: Mapping[str, Node], batch_statistics: list[Node]
) -> tuple[Graph, list[Tensor], list[Tensor], dict[str, str]]:
    """A copy of ``graph`` in which each batch norm built with ``training=True`` (its FusedBatchNorm nodes
    ``batch_statistics``) has a twin that normalizes by its moving statistics, as inference does; the copy's
    inputs and outputs, and each FusedBatchNorm's name with its twin's tensor name. The user's graph is
    left as it is."""
    for node in needed.values():
        for t in node.inputs:
            if t.op == "FusedBatchNorm" and t.index > 0:
                raise ExportError(
                    f"{node.describe()} reads output {t.index} of {t.node.describe()}, a batch statistic, "
                    "which exists only in training"
                )
    moving = {}
    for node in batch_statistics:
        found = moving_statistics(node)
        if found is None:
            raise ExportError(
                f"output needs {node.describe()}, which normalizes each batch by its own statistics and keeps "
                "no moving statistics to use at inference (only cg.layers.batch_norm's are kept): build the "
                "model with cg.layers.batch_norm, whose moving statistics the saved model uses"
            )
        moving[node.name] = found
    work = from_graphdef(to_graphdef(graph))
    replaced = {}
    for node in batch_statistics:
        twin = work.node(node.name)
        x, gamma, beta = twin.inputs
        mean, variance = (work.tensor(t.name) for t in moving[node.name])
        with work.as_default(), contextlib.ExitStack() as scopes:
            for part in f"{node.name}_inference".split("/"):  # beside the node, in its scope
                scopes.enter_context(name_scope(part))
            if mean.dtype != x.dtype:  # float32 moving statistics of a mixed-precision layer
                mean, variance = cast(mean, x.dtype), cast(variance, x.dtype)
            y = normalized(x, gamma, beta, mean, variance, node.attrs["epsilon"], node.attrs["channel_axis"])
        replaced[node.name] = y.name
    return work, [work.tensor(t.name) for t in ins], [work.tensor(t.name) for t in outs], replaced


def _needed(graph: Graph, outputs: list[Tensor], stop: set[Node], replaced: Mapping[str, str]) -> dict[str, Node]:
    """The nodes the outputs read, walking back through data edges and stopping at ``stop``; a node that picks
    its training result (``_switched``) is followed to its inference input only."""
    needed: dict[str, Node] = {}
    pending = [t.node for t in outputs]
    while pending:
        node = pending.pop()
        if node.name in needed:
            continue
        if node.stale is not None:
            raise ExportError(f"output needs {node.describe()}, which is stale: {node.stale}")
        needed[node.name] = node
        if node in stop:
            continue
        chosen = _switched(node, replaced)
        if chosen is not None:
            pending.append(chosen.node)
            continue
        if is_training_switch(node):
            continue  # it becomes the constant False: its default is not needed
        for t in node.inputs:
            if t.node not in graph:
                raise ExportError(f"output needs {t.node.name!r}, an input of {node.describe()} no longer in the graph")
            if t.op in INFERENCE_REWRITES and t.index > 0:
                raise ExportError(
                    f"{node.describe()} reads output {t.index} of {t.node.describe()}, which exists only in training"
                )
            pending.append(t.node)
    return needed


# ---------------------------------------------------------------- trained values
Source = Any  # a Session, a Job, a checkpoint folder (str or Path) or a mapping of arrays


def trained_values(source: Source, graph: Graph) -> dict[str, np.ndarray]:
    """The values of ``graph``'s variables from ``source``, by variable name.

    ``source`` is a ``Session`` (its current values), a ``Job`` (the parameter
    servers' current values, via ``job.variables()``), a parameter-server
    checkpoint folder (its newest complete checkpoint), or a mapping of arrays.
    """
    if isinstance(source, Session):
        store = source.variable_values()
        values = {n.name: store[n.name] for n in graph.variables() if n.name in store}
    elif isinstance(source, (str, Path)):
        values = checkpoint_values(source)
    elif isinstance(source, Mapping):
        values = {str(k): np.asarray(v) for k, v in source.items()}
    elif callable(getattr(source, "variables", None)):
        values = dict(source.variables())
    else:
        raise ExportError(
            f"cannot read variable values from a {type(source).__name__}: give a Session, a Job, "
            "a checkpoint folder or a mapping of arrays"
        )
    out: dict[str, np.ndarray] = {}
    for node in graph.variables():
        if node.name not in values and not node.attrs.get("trainable", True) and not isinstance(source, Mapping):
            # An untrained variable the step never assigns (a frozen layer) is kept by each replica, not by the
            # parameter servers (cluster/placed_training.py): its value is still its initial one.
            values[node.name] = np.array(node.attrs["initial_value"], dtype=node.specs[0].dtype)
        if node.name not in values:
            held = ", ".join(sorted(values)[:8]) or "none"
            raise ExportError(f"variable {node.name!r} has no value in the {_describe(source)} (it holds: {held})")
        value = np.asarray(values[node.name])
        spec = node.specs[0]
        if value.shape != spec.shape or value.dtype != np.dtype(spec.dtype):
            raise ExportError(
                f"variable {node.name!r} is {spec.dtype}{spec.shape} in the graph but "
                f"{value.dtype}{value.shape} in the {_describe(source)}"
            )
        out[node.name] = value
    return out


def _describe(source: Source) -> str:
    if isinstance(source, (str, Path)):
        return f"checkpoint folder {str(source)!r}"
    return type(source).__name__


def checkpoint_values(directory: str | Path) -> dict[str, np.ndarray]:
    """Every variable of the newest checkpoint that all shards of a job committed, whole.

    Pieces of a variable split across shards are joined along axis 0 by the
    rows each shard's spec records. Optimizer slots are left out.
    """
    from cellgraph.cluster.ps.checkpoint import list_checkpoints, read_shard_checkpoint

    root = Path(directory)
    if not root.is_dir():
        raise ExportError(f"checkpoint folder {str(root)!r} does not exist or is not a folder")
    manifests = [_MANIFEST.fullmatch(p.name) for p in root.glob("ckpt-*/shard-*-of-*.json")]
    found: dict[int, set[int]] = {}  # shard count: the shards with a manifest
    for match in filter(None, manifests):
        found.setdefault(int(match[2]), set()).add(int(match[1]))
    if len(found) != 1:
        held = "no shard manifests" if not found else f"shards of jobs with {sorted(found)} shards"
        raise ExportError(f"checkpoint folder {str(root)!r} holds {held}: expected the checkpoints of one job")
    [(shards, present)] = found.items()
    # The count comes from file names: a shard without a manifest anywhere is never complete, and a count
    # of 10**9 from one stray name must not make a listing of the folder per shard.
    absent = sorted(set(range(min(shards, len(present) + 1))) - present)
    if absent:
        raise ExportError(
            f"checkpoint folder {str(root)!r} holds manifests of a job of {shards} shards, but none of shard "
            f"{absent[0]} (shard-{absent[0]}-of-{shards}.json in no ckpt-* folder)"
        )
    steps = [{info.name for info in list_checkpoints(root, s, shards)} for s in range(shards)]
    complete = sorted(set.intersection(*steps))
    if not complete:
        raise ExportError(f"checkpoint folder {str(root)!r} has no checkpoint that all {shards} shards committed")
    name = complete[-1]
    pieces: dict[str, list[tuple[int, np.ndarray]]] = {}
    jobs: list[str] = []
    for s in range(shards):
        ckpt = read_shard_checkpoint(root, name, s, shards)
        jobs.append(ckpt.job_id)
        if ckpt.job_id != jobs[0]:
            # Two jobs wrote into one folder and one's checkpoint of a step replaced the other's shard: joined,
            # the pieces made a model neither job trained, without a word.
            raise ExportError(
                f"checkpoint {name} in folder {str(root)!r} mixes two jobs' shards: shard 0 is job {jobs[0]!r}'s, "
                f"shard {s} job {ckpt.job_id!r}'s (two jobs wrote into one checkpoint folder); give each job its "
                "own checkpoint folder (cg.train(checkpoint_dir=...), cellgraph train --checkpoint-dir)"
            )
        for spec in ckpt.specs:
            start = spec.rows[0] if spec.rows is not None else 0
            pieces.setdefault(spec.name, []).append((start, ckpt.tensors[spec.name]))
    return {
        var: parts[0][1] if len(parts) == 1 else np.concatenate([p for _, p in sorted(parts, key=lambda x: x[0])])
        for var, parts in pieces.items()
    }


def describe_spec(t: Tensor) -> dict[str, Any]:
    """A tensor's name, dtype and shape (None for a dynamic dim), as a signature records it."""
    return {"name": t.name, "dtype": t.dtype, "shape": list(t.shape)}


def read_json(path: Path, what: str) -> dict[str, Any]:
    from cellgraph.cluster.ps.checkpoint_manifest import read_regular_file

    try:
        data = json.loads(read_regular_file(path))
    except FileNotFoundError:
        raise ExportError(f"{what} {str(path)!r} is missing") from None
    except OSError as err:  # a link to /dev/zero or a FIFO: read without end, or never
        raise ExportError(f"{what} {str(path)!r} cannot be read: {err.strerror or err}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ExportError(f"{what} {str(path)!r} is not JSON ({err})") from None
    if not isinstance(data, dict):
        raise ExportError(f"{what} {str(path)!r} is not a JSON object")
    return data


__all__ = ["INFERENCE_REWRITES", "ExportError", "InferenceGraph", "checkpoint_values", "inference_graph"]


def write_atomically(path: Path, data: bytes, what: str) -> None:
    """``data`` into file ``path`` through a temporary file beside it, renamed over it once whole: a crash or a
    full disk leaves the old file (or none), never half of one. An ``ExportError`` names ``what`` and ``path``
    when it cannot be written (a folder there, no permission): these were OSError tracebacks."""
    if path.is_dir():
        raise ExportError(f"cannot write {what} to {str(path)!r}: it is a folder; give a file name")
    above = next((p for p in path.parents if p.exists()), None)  # the folders below it are made
    if above is not None and not above.is_dir():
        raise ExportError(f"cannot write {what} to {str(path)!r}: {str(above)!r} is a file, not a folder")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # os.open, not tempfile: its mode is 0o666 less the umask, as a plain open's, not tempfile's 0o600.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        os.replace(tmp, path)
    except OSError as err:
        raise ExportError(f"cannot write {what} to {str(path)!r}: {err.strerror or err}") from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
