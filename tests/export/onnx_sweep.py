"""An oracle sweep of ONNX import: one-node models run by ONNX Runtime and by ``cg.onnx.import_model``.

A ``Case`` is one node (op, opset, attributes) with its inputs: arrays fed at
run time, or ``Const`` arrays stored as initializers (the inputs a row needs
at build time: axes, shapes, pads). ``check(case)`` runs it both ways and
returns a ``Verdict``: ``agree``, ``refused`` (cellgraph raised ``OnnxError``,
a stated limit), ``no_oracle`` (ONNX Runtime has no kernel for that version
and dtype, or refuses the model), ``both_fail`` (inputs both refuse when the
graph runs: an index out of range) or ``differ`` (a wrong number, dtype or
shape, numbers where ONNX Runtime fails, or an error that is not an
``OnnxError``: the bugs this sweep hunts).

Integers and bools must be equal; floats agree within ``case.rtol`` and
``case.atol`` (NaN where ONNX Runtime has NaN, infinities of the same sign).
The cases themselves are generated in ``onnx_sweep_cases.py`` and ``onnx_sweep_array_cases.py``
with ``values`` (random values with each dtype's edges) and ``tolerance``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

import cellgraph as cg
from cellgraph.onnx.common import OnnxError
from cellgraph.onnx.import_ops import IMPORTERS

# The newest default-domain opset this ONNX knows; ONNX Runtime refuses a version it has no kernel for.
NEWEST_OPSET = onnx.defs.onnx_opset_version()
# ONNX Runtime's CPU provider runs models of opset 7 and newer.
OLDEST_ORACLE_OPSET = 7

DTYPES: dict[str, Any] = {
    "tensor(float)": np.dtype(np.float32),
    "tensor(double)": np.dtype(np.float64),
    "tensor(float16)": np.dtype(np.float16),
    "tensor(bfloat16)": np.dtype(ml_dtypes.bfloat16),
    "tensor(int8)": np.dtype(np.int8),
    "tensor(uint8)": np.dtype(np.uint8),
    "tensor(int16)": np.dtype(np.int16),
    "tensor(int32)": np.dtype(np.int32),
    "tensor(int64)": np.dtype(np.int64),
    # Computed wider by cellgraph (uint16 as int32, uint32 as int64), wrapped back at the model's boundary.
    "tensor(uint16)": np.dtype(np.uint16),
    "tensor(uint32)": np.dtype(np.uint32),
    "tensor(bool)": np.dtype(np.bool_),
}
FLOATS = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


@dataclass(frozen=True)
class Const:
    """An input stored in the model as an initializer (known when the graph is built)."""

    value: np.ndarray


Input = np.ndarray | Const | None  # None: an optional input left out ("")


@dataclass
class Case:
    """One ONNX node and its inputs, at one opset."""

    op: str
    opset: int
    inputs: list[Input]
    attrs: dict[str, Any] = field(default_factory=dict)
    outputs: int = 1
    rtol: float = 1e-6
    atol: float = 0.0
    note: str = ""
    # The exact answer, where ONNX Runtime's is known not to be (``note`` says why): checked instead.
    expect: list[np.ndarray] | None = None

    def describe(self) -> str:
        shown = []
        for value in self.inputs:
            if value is None:
                shown.append("-")
            elif isinstance(value, Const):
                shown.append(f"const {value.value.dtype}{list(value.value.shape)}={value.value.reshape(-1).tolist()}")
            else:
                shown.append(f"{value.dtype}{list(value.shape)}")
        note = f" [{self.note}]" if self.note else ""
        return f"{self.op} (opset {self.opset}) {self.attrs} ({', '.join(shown)}){note}"


Cases = Iterator["Case"]


@dataclass
class Verdict:
    kind: str  # agree, refused, no_oracle, differ, both_fail (bad inputs: both raise)
    detail: str = ""


def model_of(case: Case) -> onnx.ModelProto:
    names, graph_inputs, initializers = [], [], []
    for i, value in enumerate(case.inputs):
        if value is None:
            names.append("")
            continue
        name = f"in{i}"
        names.append(name)
        if isinstance(value, Const):
            initializers.append(numpy_helper.from_array(value.value, name))
        else:
            code = helper.np_dtype_to_tensor_dtype(value.dtype)
            graph_inputs.append(helper.make_tensor_value_info(name, code, list(value.shape)))
    outs = [f"out{i}" for i in range(case.outputs)]
    node = helper.make_node(case.op, names, outs, name="swept", **case.attrs)
    # Output types left for shape inference: the case need not know them.
    inferred = onnx.shape_inference.infer_shapes(
        helper.make_model(
            helper.make_graph([node], "sweep", graph_inputs, [helper.make_value_info(o, onnx.TypeProto()) for o in outs],
                              initializers),
            opset_imports=[helper.make_opsetid("", case.opset)],
        )
    )  # fmt: skip
    types = {v.name: v for v in inferred.graph.value_info}
    outputs = [types.get(o, helper.make_value_info(o, onnx.TypeProto())) for o in outs]
    graph = helper.make_graph([node], "sweep", graph_inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", case.opset)])
    model.ir_version = 8  # one ONNX Runtime reads for every opset it runs
    return model


def _feeds(case: Case) -> dict[str, np.ndarray]:
    return {f"in{i}": v for i, v in enumerate(case.inputs) if isinstance(v, np.ndarray)}


@functools.cache
def _session_options() -> ort.SessionOptions:
    options = ort.SessionOptions()
    # The kernel itself is the oracle: no fusion or constant folding in between.
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4  # fatal only: a kernel refusing out-of-range indices is a verdict
    return options


@dataclass(frozen=True)
class Rejected:
    """ONNX Runtime ran the model and failed on these inputs (an index out of range)."""

    detail: str


def oracle(case: Case) -> list[np.ndarray] | Rejected | str:
    """ONNX Runtime's outputs; ``Rejected`` when it refuses the inputs; else why it has no kernel."""
    try:
        model = model_of(case)
        session = ort.InferenceSession(
            model.SerializeToString(), _session_options(), providers=["CPUExecutionProvider"]
        )
    except Exception as err:  # NOT_IMPLEMENTED kernels, versions it does not read, its own shape checks
        return f"{type(err).__name__}: {str(err)[:200]}"
    try:
        return [np.asarray(v) for v in session.run(None, _feeds(case))]
    except Exception as err:
        if "Non-zero status code returned while running" in str(err):
            return Rejected(f"{type(err).__name__}: {str(err)[:200]}")  # a kernel refused the inputs
        return f"{type(err).__name__}: {str(err)[:200]}"  # it takes no such array (bfloat16 from NumPy)


def imported(case: Case, constants: bool = False) -> list[np.ndarray]:
    """cellgraph's outputs (an ``OnnxError`` for a model it refuses). ``constants``: the inputs fed at
    run time are Constant nodes of the model instead, so the importer knows them all ahead."""
    model = cg.onnx.import_model(constant_model(case) if constants else model_of(case))
    with np.errstate(all="ignore"):
        result = model() if constants else model(*_feeds(case).values())
    return [np.asarray(r) for r in (result if isinstance(result, tuple) else (result,))]


def constant_model(case: Case) -> onnx.ModelProto:
    """``case``'s model with its graph inputs turned into Constant nodes of the values fed."""
    model = model_of(case)
    graph = model.graph
    feeds = _feeds(case)
    constants = [helper.make_node("Constant", [], [v.name], value=numpy_helper.from_array(feeds[v.name]))
                 for v in graph.input]  # fmt: skip
    nodes = [*constants, *graph.node]
    del graph.input[:]
    del graph.node[:]
    graph.node.extend(nodes)
    return model


def _as_compared(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float64) if a.dtype in FLOATS else a


# Ops whose float results are one of their inputs' values, or one exact rounding of them: equal, not
# close (a 2-ulp difference at 3.4e38 is 1.2e-7 relative, inside any float tolerance).
EXACT_OPS = frozenset({
    "Identity", "Neg", "Abs", "Relu", "Max", "Min", "Clip", "Where", "Gather", "GatherND", "Slice", "Expand",
    "Pad", "Tile", "Transpose", "Reshape", "Flatten", "Concat", "Split", "Squeeze", "Unsqueeze", "Trilu", "TopK",
    "Sign", "Ceil", "Floor", "Round", "Cast", "MaxPool", "GlobalMaxPool", "ReduceMax", "ReduceMin", "Hardmax",
    "OneHot", "SpaceToDepth", "DepthToSpace", "Constant", "Mod", "LeakyRelu", "ConstantOfShape", "Dropout",
    "Add", "Sub", "Mul", "Div", "Sqrt", "Reciprocal",  # IEEE operations: one correct rounding
})  # fmt: skip


def compare(case: Case, want: list[np.ndarray], got: list[np.ndarray]) -> str | None:
    """Why ``got`` is not ``want`` (None when they agree)."""
    rtol, atol = (0.0, 0.0) if case.op in EXACT_OPS else (case.rtol, case.atol)
    if len(got) != len(want):
        return f"{len(got)} outputs, ONNX Runtime has {len(want)}"
    for i, (w, g) in enumerate(zip(want, got, strict=True)):
        if g.dtype != w.dtype:
            return f"output {i}: dtype {g.dtype}, ONNX Runtime's is {w.dtype}"
        if g.shape != w.shape:
            return f"output {i}: shape {g.shape}, ONNX Runtime's is {w.shape}"
        wf, gf = _as_compared(w), _as_compared(g)
        if w.dtype in FLOATS:
            wrong = ~np.isclose(gf, wf, rtol=rtol, atol=atol, equal_nan=True)
            wrong |= np.isinf(wf) & (gf != wf)
        else:
            wrong = gf != wf
        if wrong.any():
            at = tuple(int(j) for j in np.argwhere(wrong)[0])
            return (
                f"output {i}: {int(wrong.sum())} of {w.size} values differ, first at {at}: "
                f"cellgraph {g[at]!r}, ONNX Runtime {w[at]!r}"
            )
    return None


def check(case: Case, constants: bool = False) -> Verdict:
    """``case`` run by ONNX Runtime and imported (with its inputs as Constant nodes: ``constants``)."""
    want = oracle(case)
    if isinstance(want, str):
        return Verdict("no_oracle", want)
    try:
        got = imported(case, constants)
    except OnnxError as err:
        return Verdict("refused", str(err))
    except Exception as err:
        if isinstance(want, Rejected):  # both refuse these inputs when the graph runs
            return Verdict("both_fail", f"{type(err).__name__}: {err}")
        # Anything but a stated refusal is a bug: the model ran in ONNX Runtime.
        return Verdict("differ", f"{type(err).__name__} instead of a result or an OnnxError: {err}")
    if isinstance(want, Rejected):
        return Verdict("differ", f"numbers where ONNX Runtime fails ({want.detail})")
    why = compare(case, case.expect if case.expect is not None else want, got)
    return Verdict("differ", why) if why else Verdict("agree")


def versions(op: str, since: int = 1) -> list[int]:
    """One opset per version of ``op`` from ``since`` on that ONNX Runtime can run: the version's own
    (its since_version), or opset 7 for an older version still in force there (Clip-6 at opset 7)."""
    found = {
        s.since_version
        for s in onnx.defs.get_all_schemas_with_history()
        if s.domain == "" and s.name == op and since <= s.since_version <= NEWEST_OPSET
    }
    opsets = (max(v, OLDEST_ORACLE_OPSET) for v in found)
    return sorted(o for o in opsets if onnx.defs.get_schema(op, o, "").since_version in found)


def allowed(op: str, version: int, param: str = "T") -> list[np.dtype[Any]]:
    """The dtypes (of those cellgraph knows) that version ``version`` of ``op`` allows for ``param``."""
    schema = onnx.defs.get_schema(op, version, "")
    for constraint in schema.type_constraints:
        if constraint.type_param_str == param:
            return [DTYPES[t] for t in constraint.allowed_type_strs if t in DTYPES]
    raise KeyError(f"{op}-{version} has no type parameter {param!r}")


def run_all(cases: Iterable[Case], constants: bool = False) -> dict[str, list[tuple[Case, Verdict]]]:
    """Every case checked, grouped by verdict kind."""
    out: dict[str, list[tuple[Case, Verdict]]] = {
        k: [] for k in ("agree", "refused", "no_oracle", "differ", "both_fail")
    }
    for case in cases:
        verdict = check(case, constants)
        out[verdict.kind].append((case, verdict))
    return out


def values(rng: np.random.Generator, dtype: np.dtype[Any], shape: tuple[int, ...], special: bool = True,
           low: float | None = None, high: float | None = None, ties: bool = False) -> np.ndarray:  # fmt: skip
    """Random values of ``dtype`` with its edges mixed in (NaN, +-inf, -0.0; or the integer extremes);
    ``ties``: floats rounded to whole numbers, so that a small range repeats values as integers do."""
    size = int(np.prod(shape))
    if dtype == np.bool_:
        return rng.integers(0, 2, size).astype(bool).reshape(shape)
    if dtype in FLOATS:
        x = rng.uniform(-4.0 if low is None else low, 4.0 if high is None else high, size)
        x = (np.round(x) if ties else x).astype(object)
        edges: list[Any] = [np.nan, np.inf, -np.inf, -0.0, 0.0] if special else []
    else:
        info = np.iinfo(dtype)
        lo = max(int(info.min), -100 if low is None else int(low))
        hi = min(int(info.max), 100 if high is None else int(high))
        x = rng.integers(lo, hi + 1, size).astype(object)
        edges = [int(info.min), int(info.max), 0, 1] if special else []
    for i, e in enumerate(edges[: max(size - 1, 0)]):
        x[(i * 7 + 1) % size] = e
    return np.array(x.tolist(), dtype=dtype).reshape(shape)


def tolerance(dtype: np.dtype[Any], float32: float = 1e-6) -> dict[str, float]:
    """rtol for a float result: cellgraph computes float16 and bfloat16 in float32 and rounds once,
    as ONNX Runtime's CPU kernels do, so one unit in the last place of the narrow type."""
    if dtype == np.float16:
        return {"rtol": 2.0**-10, "atol": 2.0**-24}
    if dtype.name == "bfloat16":
        return {"rtol": 2.0**-7, "atol": 0.0}
    if dtype == np.float64:
        return {"rtol": max(float32 * 1e-8, 1e-14), "atol": 0.0}
    return {"rtol": float32, "atol": 0.0}


def since(op: str) -> list[int]:
    """The versions of ``op`` to sweep: from its row's ``since`` on, those ONNX Runtime can run."""
    return versions(op, IMPORTERS[op].since)
