"""A trained model as one folder that a fresh process can run: ``save_model`` / ``load_model``.

The folder holds three files::

    model.graphdef          # the inference GraphDef (protobuf); variables carry shape and dtype only
    variables.safetensors   # the trained values, by variable name
    signature.json          # format, inputs and outputs (name, dtype, shape; null for a dynamic dim),
                            # and the sha256 of the two files above (a load mid-save is refused)

Examples
--------
>>> import tempfile
>>> import cellgraph as cg
>>> g = cg.Graph()
>>> with g.as_default():
...     x = cg.placeholder((None, 2), name="x")
...     y = cg.layers.dense(x, 1, name="out")
>>> s = cg.Session(g)
>>> with tempfile.TemporaryDirectory() as d:
...     folder = cg.save_model(d, x, y, s)
...     model = cg.load_model(d)
...     bool((model([[1.0, 2.0]]) == s.run(y, {x: [[1.0, 2.0]]})).all())
True
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import safetensors
import safetensors.numpy

from cellgraph.dataflow.errors import CellgraphError
from cellgraph.dataflow.graph import Graph, Tensor
from cellgraph.dataflow.graphdef import from_graphdef, to_graphdef, to_tensor_proto
from cellgraph.dataflow.session import Session
from cellgraph.protos import graph_pb2

from .inference import (
    ExportError,
    Source,
    describe_spec,
    inference_graph,
    read_json,
    trained_values,
    write_atomically,
)

FORMAT = "cellgraph-saved-model"
FORMAT_VERSION = 1
GRAPH_FILE = "model.graphdef"
VARIABLES_FILE = "variables.safetensors"
SIGNATURE_FILE = "signature.json"
# safetensors' dtype codes, as NumPy dtypes (little-endian, as the format is). safetensors.numpy.load has no
# bfloat16 (NumPy has none), so a model with a bfloat16 variable was saved and then refused as "damaged: 'BF16'".
SAFETENSORS_DTYPES = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": ml_dtypes.bfloat16, "I64": "<i8", "I32": "<i4", "I16": "<i2",
    "I8": "i1", "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?",
}  # fmt: skip


def save_model(
    path: str | Path,
    inputs: Tensor | Sequence[Tensor],
    outputs: Tensor | Sequence[Tensor],
    source: Source,
) -> Path:
    """Write the inference graph of ``outputs`` fed by ``inputs``, and its trained variables, to folder ``path``.

    ``source`` gives the variables' values: a ``Session``, a ``Job`` (the
    parameter servers' current values), a parameter-server checkpoint folder,
    or a mapping of arrays by variable name. Returns the folder: a new or
    empty one, or an earlier saved model's (overwritten, each file whole or
    not at all); a folder holding other files is refused.
    """
    model = inference_graph(inputs, outputs)
    values = trained_values(source, model.graph)
    graphdef = to_graphdef(model.graph)
    for proto in graphdef.node:
        # Cells and source lines belong to the notebook that built the model, not to the model.
        for key in ("cell", "cell_label", "file", "line"):
            proto.ClearField(key)  # type: ignore[arg-type]
        if proto.op == "Variable":
            # The values live in the safetensors file; the GraphDef keeps the shape and dtype.
            proto.attr["initial_value"].tensor.content = b""
    folder = Path(path)
    _refuse_other_files(folder)
    # Not np.ascontiguousarray: it makes a 0-d array 1-d, and a scalar variable would not load back.
    arrays = {k: np.asarray(v, order="C") for k, v in values.items()}
    files = {
        GRAPH_FILE: graphdef.SerializeToString(deterministic=True),
        VARIABLES_FILE: safetensors.numpy.save(arrays, metadata={"format": FORMAT}),
    }
    signature = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "inputs": [describe_spec(t) for t in model.tensors(model.inputs)],
        "outputs": [describe_spec(t) for t in model.tensors(model.outputs)],
        "variables": sorted(values),
        # Which graph and variables files this signature was written with: a load while a save replaces them one
        # by one read one save's graph with another's variables (same names and shapes: no other check saw it).
        "sha256": {name: hashlib.sha256(data).hexdigest() for name, data in files.items()},
    }
    files[SIGNATURE_FILE] = (json.dumps(signature, indent=2) + "\n").encode()  # written last
    for name, data in files.items():  # each whole or not at all (a crash wrote half a variables file)
        write_atomically(folder / name, data, f"the saved model's {name}")
    return folder


def _refuse_other_files(folder: Path) -> None:
    """A saved model's folder is new, empty or an older saved model's: written into a checkpoint folder (or any
    other), its three files mixed with what was there, and a file there ended in a FileExistsError traceback."""
    if folder.exists() and not folder.is_dir():
        raise ExportError(f"cannot save a model to {str(folder)!r}: it is a file; a saved model is a folder")
    if not folder.is_dir():
        return
    ours = (GRAPH_FILE, VARIABLES_FILE, SIGNATURE_FILE)
    # A crashed save's temporary file (write_atomically's '.NAME.PID.HEX.tmp') is no other file.
    others = sorted(p.name for p in folder.iterdir() if p.name not in ours and not _temporary(p.name))
    if others:
        shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
        raise ExportError(
            f"cannot save a model to folder {str(folder)!r}: it already holds {shown}, which are not a saved "
            "model's; give a new or empty folder (a saved model's own folder is overwritten)"
        )


def _temporary(name: str) -> bool:
    return name.startswith(".") and name.endswith(".tmp")


class LoadedModel:
    """A saved model, ready to run: ``model(x)`` returns its output (a tuple for several).

    ``graph`` is a cellgraph graph whose variables start from the trained
    values, so it can be trained further; ``session`` runs it.
    """

    def __init__(self, graph: Graph, inputs: list[Tensor], outputs: list[Tensor], signature: dict[str, Any]) -> None:
        self.graph = graph
        self.inputs = inputs
        self.outputs = outputs
        self.signature = signature
        self.session = Session(graph)

    def __call__(self, *args: Any) -> Any:
        if len(args) != len(self.inputs):
            names = ", ".join(t.name for t in self.inputs)
            raise ExportError(f"this model takes {len(self.inputs)} input(s) ({names}), got {len(args)}")
        results = self.session.run(self.outputs, dict(zip(self.inputs, args, strict=True)))
        return results[0] if len(results) == 1 else tuple(results)

    def __repr__(self) -> str:
        ins = ", ".join(repr(t) for t in self.inputs)
        outs = ", ".join(repr(t) for t in self.outputs)
        return f"<LoadedModel ({ins}) -> ({outs})>"


def load_model(path: str | Path) -> LoadedModel:
    """The model saved in folder ``path``, rebuilt in this process with its trained values."""
    folder = Path(path)
    signature = read_json(folder / SIGNATURE_FILE, "saved model signature")
    if signature.get("format") != FORMAT:
        raise ExportError(f"{str(folder)!r} is not a cellgraph saved model (signature.json has no {FORMAT!r} format)")
    if signature.get("format_version") != FORMAT_VERSION:
        raise ExportError(
            f"saved model {str(folder)!r} has format version {signature.get('format_version')!r}; "
            f"this cellgraph reads version {FORMAT_VERSION}"
        )
    try:
        read = {name: _read(folder, name) for name in (GRAPH_FILE, VARIABLES_FILE)}
        graphdef = graph_pb2.GraphDef.FromString(read[GRAPH_FILE])
        values = read_arrays(read[VARIABLES_FILE])
    except FileNotFoundError as err:
        raise ExportError(f"saved model {str(folder)!r} is missing {Path(str(err.filename)).name}") from None
    except ExportError:
        raise
    except Exception as err:  # protobuf's DecodeError, safetensors' SafetensorError
        raise ExportError(f"saved model {str(folder)!r} is damaged: {err}") from err
    names = {key: _signature_names(signature, key, folder) for key in ("inputs", "outputs")}
    for proto in graphdef.node:
        if proto.op == "Variable":
            _fill_variable(proto, values, folder)
    try:
        graph = from_graphdef(graphdef)
        inputs = [graph.tensor(name) for name in names["inputs"]]
        outputs = [graph.tensor(name) for name in names["outputs"]]
    # ValueError: a tensor value whose dims overflow int64 (cannot reshape an empty array into them).
    except (CellgraphError, KeyError, TypeError, ValueError) as err:
        raise ExportError(f"saved model {str(folder)!r} does not rebuild: {err}") from err
    _check_signature(signature, {"inputs": inputs, "outputs": outputs}, values, folder)
    _check_files(signature, read, folder)
    return LoadedModel(graph, inputs, outputs, signature)


def _check_files(signature: dict[str, Any], read: dict[str, bytes], folder: Path) -> None:
    """The graph and variables files are those the signature was saved with (a saved model written before the
    signature recorded them has no ``sha256``: nothing to check). Checked last, so that a file that does not
    rebuild or fit the signature says so first."""
    recorded = signature.get("sha256")
    if recorded is None:
        return
    for name, data in read.items():
        expected = recorded.get(name) if isinstance(recorded, dict) else None
        if hashlib.sha256(data).hexdigest() != expected:
            raise ExportError(
                f"saved model {str(folder)!r}: {name} is not the file {SIGNATURE_FILE} was saved with (its sha256 "
                f"differs): a save into this folder is under way, or its files come from two saves; load it again "
                "once the save is done"
            )


def _read(folder: Path, name: str) -> bytes:
    """File ``name`` of the saved model, a regular file: one linked to /dev/zero was read until memory ran out."""
    from cellgraph.cluster.ps.checkpoint_manifest import read_regular_file

    try:
        return read_regular_file(folder / name)
    except FileNotFoundError:
        raise
    except OSError as err:
        raise ExportError(f"saved model {str(folder)!r}: cannot read {name}: {err.strerror or err}") from None


def _check_signature(
    signature: dict[str, Any], tensors: dict[str, list[Tensor]], values: dict[str, np.ndarray], folder: Path
) -> None:
    """The signature says what the graph and the variables file hold: one that disagreed loaded without a word,
    and whoever read it (a server sizing its inputs) was told a dtype, shape or variable the model does not have."""
    for key, ts in tensors.items():
        for entry, t in zip(signature[key], ts, strict=True):
            actual = describe_spec(t)
            said = {field: entry.get(field, actual[field]) for field in ("dtype", "shape")}
            if said["dtype"] != actual["dtype"] or said["shape"] != actual["shape"]:
                raise ExportError(
                    f"saved model {str(folder)!r}: {SIGNATURE_FILE} says {key[:-1]} {t.name!r} is "
                    f"{said['dtype']} {json.dumps(said['shape'])[:100]}, but {GRAPH_FILE} makes it "
                    f"{actual['dtype']} {json.dumps(actual['shape'])}"
                )
    listed = signature.get("variables", sorted(values))
    if listed != sorted(values):
        raise ExportError(
            f"saved model {str(folder)!r}: {SIGNATURE_FILE} lists variables {json.dumps(listed)[:200]}, but "
            f"{VARIABLES_FILE} holds {json.dumps(sorted(values))[:200]}"
        )


def _signature_names(signature: dict[str, Any], key: str, folder: Path) -> list[str]:
    """The tensor names of the signature's ``inputs`` or ``outputs``: a list of objects with a string ``name``."""
    entries = signature.get(key)
    if not isinstance(entries, list) or not all(
        isinstance(e, dict) and isinstance(e.get("name"), str) for e in entries
    ):
        raise ExportError(
            f"saved model {str(folder)!r}: {SIGNATURE_FILE}'s {key!r} must be a list of objects with a tensor "
            f"'name' (as save_model writes it), got {json.dumps(entries)[:100]}"
        )
    return [e["name"] for e in entries]


def read_arrays(data: bytes) -> dict[str, np.ndarray]:
    """The arrays of a safetensors file, by name; bfloat16 ones as ``ml_dtypes.bfloat16``."""
    arrays = {}
    for name, info in safetensors.deserialize(data):
        code = info["dtype"]
        if code not in SAFETENSORS_DTYPES:
            raise ExportError(f"tensor {name!r} has safetensors dtype {code}, which cellgraph does not read")
        array = np.frombuffer(info["data"], np.dtype(SAFETENSORS_DTYPES[code]))  # a view of safetensors' buffer
        arrays[name] = array.reshape(info["shape"]).astype(array.dtype.newbyteorder("="), copy=False)
    return arrays


def _fill_variable(proto: graph_pb2.NodeDef, values: dict[str, np.ndarray], folder: Path) -> None:
    if proto.name not in values:
        raise ExportError(f"saved model {str(folder)!r}: variable {proto.name!r} has no value in {VARIABLES_FILE}")
    value = values[proto.name]
    recorded = proto.attr["initial_value"].tensor
    filled = to_tensor_proto(np.asarray(value))
    if filled.dtype != recorded.dtype or list(filled.shape.dim) != list(recorded.shape.dim):
        dtype = "the same dtype" if filled.dtype == recorded.dtype else "another dtype"
        raise ExportError(
            f"saved model {str(folder)!r}: variable {proto.name!r} is {value.dtype}{value.shape} in "
            f"{VARIABLES_FILE} but {tuple(recorded.shape.dim)} of {dtype} in {GRAPH_FILE}"
        )
    recorded.CopyFrom(filled)


__all__ = ["LoadedModel", "load_model", "save_model"]
