"""ONNX's own node conformance cases run through ``import_model``: pass, fail or unsupported, per op.

A case counts for an op when its model is that one ONNX node (the
``_expanded`` variants test other ops' function bodies and are left out). A
case passes when every output has ONNX's expected dtype, shape and values
(within the case's rtol and atol). It is unsupported when ``import_model``
refuses it (an attribute, dtype or rank cellgraph cannot express): never a
pass. Inputs that a row needs as values at build time (a reshape's shape fed
as a graph input) are given from the case's data as ``static_inputs``, as a
shape-specializing runtime would; everything else is fed at run time.

Nearly all of a first run's time is Numba compiling the kernels of every dtype
and rank the cases use; ``run(processes=n)`` runs the ops' cases in ``n``
processes at once (each compiles what its cases need, and shares it with the
others and later runs through Numba's disk cache), with the same results as
one process gives.

Examples
--------
>>> results = run(["Relu", "Softmax"])
>>> results["Relu"].passed, f"{results['Softmax'].pass_rate:.0%}"
(['test_relu'], '100%')
"""

from __future__ import annotations

import functools
import multiprocessing
import warnings
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cellgraph.dataflow.errors import CellgraphError

from .common import OnnxError
from .import_ops import IMPORTERS
from .import_sequences import examples_of
from .importer import import_model

# Cases whose expected outputs contradict ONNX's own text, and what cellgraph computes instead. They count as
# failures (against the pass rate); tests/export/test_onnx_resize.py checks that ONNX Runtime gives cellgraph's
# values for each. ONNX's reference, which made the expected outputs, reads align_corners' output length as
# scale * size (2.4 for 4 * 0.6); the text says the resized tensor's length (2), as ONNX Runtime and PyTorch do.
AGAINST_THE_SPEC: dict[str, str] = {
    name: "the expected values use the output length scale * size (2.4) where ONNX's text, ONNX Runtime and "
    "PyTorch use the resized tensor's length (2)"
    for name in (
        "test_resize_downsample_scales_linear_align_corners",
        "test_resize_downsample_scales_cubic_align_corners",
    )
}


@dataclass
class OpResult:
    """The cases of one ONNX op: names passed, failed (with why) and unsupported (with why)."""

    op: str
    passed: list[str] = field(default_factory=list)
    # Passed cases with values of a type cellgraph computes wider (uint16 as int32, float8 as float16).
    widened: list[str] = field(default_factory=list)
    # Passed cases of a random op (Dropout in training mode): their expected values are one NumPy
    # draw that no other generator reproduces, so the outputs are checked against the op's definition.
    random: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    unsupported: dict[str, str] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return len(self.passed) + len(self.failed) + len(self.unsupported)

    @property
    def pass_rate(self) -> float:
        return len(self.passed) / self.total if self.total else 0.0


def node_cases() -> list[Any]:
    """ONNX's node test cases (collected quietly: generating some of them warns about casts)."""
    return list(_collected())


@functools.cache
def _collected() -> tuple[Any, ...]:
    # Collecting generates every case's data (seconds): once per process. Cases are only read.
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return tuple(collect_testcases(None))


def _static_positions(case: Any) -> set[str]:
    node = case.model.graph.node[0]
    row = IMPORTERS[node.op_type]
    inputs = {v.name for v in case.model.graph.input}
    return {node.input[i] for i in row.static if i < len(node.input) and node.input[i] in inputs}


def _arrays(values: list[Any]) -> list[Any]:
    from onnx import TensorProto, numpy_helper

    return [numpy_helper.to_array(v) if isinstance(v, TensorProto) else v for v in values]


def run_case(case: Any) -> tuple[str, str]:
    """``("pass" | "fail" | "unsupported", why)`` for one case."""
    graph_inputs = [v.name for v in case.model.graph.input]
    static = _static_positions(case)
    for raw_inputs, raw_expected in case.data_sets:
        inputs, expected = _arrays(raw_inputs), _arrays(raw_expected)
        by_name = dict(zip(graph_inputs, inputs, strict=False))
        frozen = {name: by_name[name] for name in static if name in by_name}
        try:
            model = import_model(case.model, static_inputs=frozen, examples=examples_of(case.model, by_name))
        except OnnxError as err:
            return "unsupported", str(err)
        except Exception as err:  # a bug in a row: reported as a failure of that case, not a crash of the run
            return "fail", f"import: {type(err).__name__}: {err}"
        feeds = [by_name[t.node.name] if t.node.name in by_name else None for t in model.inputs]
        names = {name: value for name, value in by_name.items() if name not in frozen}
        if any(f is None for f in feeds):
            feeds = list(names.values())
        try:
            with np.errstate(all="ignore"):
                got = model(*feeds)
        except (CellgraphError, ValueError, TypeError, IndexError) as err:
            return "fail", f"run: {type(err).__name__}: {err}"
        got_list = list(got) if isinstance(got, tuple) else [got]
        random = False
        for i, (g, e) in enumerate(zip(got_list, expected, strict=False)):
            if isinstance(e, list) or e is None:  # a sequence, or an empty optional
                why = _container_mismatch(g, e)
                if why is not None:
                    return "fail", f"output {i}: {why}"
                continue
            e = np.asarray(e)
            g = np.asarray(g)
            if g.dtype != e.dtype or g.shape != e.shape:
                return "fail", f"output {i}: {g.dtype}{g.shape}, expected {e.dtype}{e.shape}"
            if e.dtype == object:  # strings: equal or not
                if not np.array_equal(g, e):
                    return "fail", f"output {i}: {g.tolist()!r}, expected {e.tolist()!r}"
                continue
            if not np.allclose(g, e, rtol=case.rtol, atol=case.atol, equal_nan=True):
                why = f"output {i}: max abs diff {np.nanmax(np.abs(g.astype(float) - e.astype(float)))}"
                node = case.model.graph.node[0]
                if case.name in AGAINST_THE_SPEC:
                    return "fail", f"{why}: {AGAINST_THE_SPEC[case.name]}"
                if node.op_type != "Dropout" or not _is_training(inputs):
                    return "fail", why
                broken = dropout_broken(inputs, got_list)
                if broken is not None:
                    return "fail", f"{why}; and not a dropout of the input: {broken}"
                random = True
                break
    if random:
        return "pass", "random"
    return "pass", "widened" if model.signature.get("widened") else ""


def _container_mismatch(got: Any, expected: list[Any] | None) -> str | None:
    """Why a sequence (a list of arrays) or an empty optional (None) is not the expected one, or None."""
    if expected is None or got is None:
        return None if got is expected else f"{got!r}, expected {expected!r}"
    if not isinstance(got, list) or len(got) != len(expected):
        return f"{type(got).__name__} of {len(got) if isinstance(got, list) else '?'}, expected {len(expected)} tensors"
    for k, (g, e) in enumerate(zip(got, expected, strict=True)):
        g, e = np.asarray(g), np.asarray(e)
        if g.dtype != e.dtype or g.shape != e.shape or not np.array_equal(g, e, equal_nan=e.dtype.kind == "f"):
            return f"element {k}: {g.dtype}{g.shape}, expected {e.dtype}{e.shape} (or other values)"
    return None


def _is_training(inputs: list[Any]) -> bool:
    return len(inputs) > 2 and bool(np.asarray(inputs[2]).reshape(-1)[0])


def dropout_broken(inputs: list[Any], outputs: list[Any]) -> str | None:
    """Why ``outputs`` are not a training-mode dropout of ``inputs`` (x, ratio, training_mode), or None.

    ONNX defines the op, not the draw: each element is kept with probability
    1 - ratio and scaled by 1 / (1 - ratio), or zeroed; the mask (when asked
    for) is true where it was kept. The kept count must lie within 5 standard
    deviations of its binomial mean.
    """
    x = np.asarray(inputs[0])
    ratio = float(np.asarray(inputs[1]).reshape(-1)[0]) if len(inputs) > 1 else 0.5
    y = np.asarray(outputs[0])
    kept = np.asarray(outputs[1]) if len(outputs) > 1 else y != 0
    if kept.dtype != np.bool_:
        return f"the mask is {kept.dtype}, not bool"
    want = np.where(kept, x / np.float32(1 - ratio), 0).astype(x.dtype)
    if not np.allclose(y, want, rtol=1e-6, atol=0):
        return "an output element is neither 0 nor x / (1 - ratio) as its mask says"
    n, p = x.size, 1.0 - ratio
    if abs(int(kept.sum()) - n * p) > 5 * np.sqrt(n * p * (1 - p)):
        return f"{int(kept.sum())} of {n} kept, expected about {n * p:.0f}"
    return None


def run(ops: Iterable[str] | None = None, cases: list[Any] | None = None, processes: int = 1) -> dict[str, OpResult]:
    """Every single-node case of each mapped ONNX op (or of ``ops``), by op.

    With ``processes`` > 1 (and ONNX's own cases, not ``cases``), the ops are dealt to that many
    worker processes, one op at a time to whichever is free; the results are the same.
    """
    wanted = set(ops) if ops is not None else set(IMPORTERS)
    if processes > 1 and cases is None:
        return _run_in_processes(sorted(wanted), processes)
    results = {op: OpResult(op) for op in sorted(wanted)}
    for case in cases if cases is not None else node_cases():
        nodes = case.model.graph.node
        if len(nodes) != 1 or nodes[0].op_type not in wanted or case.name.endswith("_expanded"):
            continue
        _record(results[nodes[0].op_type], case.name, *run_case(case))
    return results


def _record(result: OpResult, name: str, outcome: str, why: str) -> None:
    if outcome == "pass":
        result.passed.append(name)
        if why == "widened":
            result.widened.append(name)
        elif why == "random":
            result.random.append(name)
    elif outcome == "fail":
        result.failed[name] = why
    else:
        result.unsupported[name] = why


def _run_in_processes(ops: list[str], processes: int) -> dict[str, OpResult]:
    # Spawned, not forked: the caller may hold threads (a test session's servers, Dask) that a fork would copy
    # mid-lock. Each worker collects ONNX's cases itself; only op names and the outcomes' strings cross.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(processes, len(ops) or 1), mp_context=context) as pool:
        outcomes = list(pool.map(_run_op, ops))
    results = {op: OpResult(op) for op in ops}
    for op, rows in zip(ops, outcomes, strict=True):
        for name, outcome, why in rows:
            _record(results[op], name, outcome, why)
    return results


def _run_op(op: str) -> list[tuple[str, str, str]]:
    """(case, outcome, why) of every case of ``op``, in ONNX's order: one task of a worker process."""
    rows = []
    for case in _collected():
        nodes = case.model.graph.node
        if len(nodes) == 1 and nodes[0].op_type == op and not case.name.endswith("_expanded"):
            rows.append((case.name, *run_case(case)))
    return rows


def dtype_refusals(result: OpResult) -> int:
    """How many of an op's cases were refused only for a dtype cellgraph does not have."""
    return sum(1 for why in result.unsupported.values() if why.startswith(("dtype ", "graph input")))


def pass_rate(results: dict[str, OpResult], widened: bool = True) -> float:
    """Passed cases over all cases of the mapped ops (unsupported ones count against); with
    ``widened=False``, only those that pass in the case's own dtypes."""
    total = sum(r.total for r in results.values())
    passed = sum(len(r.passed) - (0 if widened else len(r.widened)) for r in results.values())
    return passed / total if total else 0.0


def markdown_table(results: dict[str, OpResult]) -> str:
    """One row per op: cases, passed, failed, unsupported, rate, and the first reason for the rest."""
    # "in own dtypes" leaves out the passes computed in a wider type (float16 as float32, int8 as
    # int32): the rate of cases whose ONNX types cellgraph has tensors of.
    header = (
        "| ONNX op | cases | pass (of which widened) | fail | unsupported (of which dtype) | pass rate "
        "| pass rate in own dtypes | first reason not passed |"
    )
    lines = [header, "|---" * 8 + "|"]
    for op, r in sorted(results.items()):
        reasons = list(r.failed.values()) + [w for w in r.unsupported.values() if not w.startswith("dtype ")]
        reasons = reasons or list(r.unsupported.values())
        if r.random and not reasons:
            reasons = [f"{len(r.random)} passes are random draws, checked against the op's definition"]
        why = reasons[0].split(" has no cellgraph equivalent")[0].replace("|", "\\|")[:90] if reasons else ""
        lines.append(
            f"| {op} | {r.total} | {len(r.passed)} ({len(r.widened)}) | {len(r.failed)} "
            f"| {len(r.unsupported)} ({dtype_refusals(r)}) "
            f"| {r.pass_rate:.0%} | {(len(r.passed) - len(r.widened)) / r.total if r.total else 0.0:.0%} | {why} |"
        )
    return "\n".join(lines)
