"""Elementwise fusion: a run of elementwise ops becomes one Numba loop.

Each op that declares a scalar expression (``OpDef.elementwise``) may join the
segment of the op that feeds it, when that op's output is used by nothing
else. A segment compiles to one ``@njit`` function that reads every external
input once and writes one output, so a 200-op chain costs one call instead of
200 and no intermediate buffer. Inputs must have the output's shape or hold a
single value; anything else (true broadcasting, say (3, 1) + (1, 4)) runs the
ops one by one, exactly as without fusion.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import math
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .graph import Node, Tensor
from .kernels.compile_once import cache_dir, compile_once

Key = tuple[int, int]


def _key(t: Tensor) -> Key:
    return (id(t.node), t.index)


@dataclass
class Segment:
    """Fused nodes in execution order; the last one's output is the segment's."""

    nodes: list[Node] = field(default_factory=list)
    # The tensors each node reads: its inputs, unless the plan folded some (switch_fold.Folding.reads).
    reads: Callable[[Node], Sequence[Tensor]] = field(default=lambda node: node.inputs, repr=False)

    @property
    def output(self) -> Tensor:
        return self.nodes[-1].output(0)

    def inputs(self) -> list[Tensor]:
        """Tensors the segment reads from outside, each once, in first-use order."""
        inside = {id(n) for n in self.nodes}
        seen: dict[Key, Tensor] = {}
        for node in self.nodes:
            for t in self.reads(node):
                if id(t.node) not in inside:
                    seen.setdefault(_key(t), t)
        return list(seen.values())


def _fusable(node: Node) -> bool:
    opdef = node.opdef
    if opdef.elementwise is None or len(node.specs) != 1 or node.control_inputs:
        return False
    dtype = node.specs[0].dtype
    # A bool input (Where's condition) is read as it is; every other input has the output's dtype.
    return dtype in ("float32", "float64") and all(t.dtype in (dtype, "bool") for t in node.inputs)


def is_constant(node: Node) -> bool:
    """No inputs and no state: the node gives the same value every run."""
    return not node.inputs and not node.opdef.stateful and not node.control_inputs and len(node.specs) == 1


def find_segments(
    order: Sequence[Node],
    keep: set[Key],
    reads: Callable[[Node], Sequence[Tensor]] | None = None,
    unfused: set[int] | None = None,
) -> list[Segment]:
    """Segments of two or more fusable nodes; ``keep`` holds tensors needed outside
    the plan's nodes (fetches), which must stay materialised. ``reads`` gives the
    tensors a node reads (default: its inputs); nodes whose id is in ``unfused``
    run on their own (a plan's adds of zeros, kept as a shape check).

    A node joins only the segment of the node scheduled right before it
    (constants aside): a segment runs where its last node was, so joining one
    made earlier would keep that segment's inputs alive longer and raise the
    plan's peak memory instead of lowering it.
    """
    read = reads or (lambda node: node.inputs)
    skip = unfused or set()
    uses: dict[Key, int] = {}
    for node in order:
        for t in read(node):
            uses[_key(t)] = uses.get(_key(t), 0) + 1
    segments: list[Segment] = []
    current: Segment | None = None
    for node in order:
        if is_constant(node):
            continue
        fusable = _fusable(node) and id(node) not in skip
        joins = (
            current is not None
            and fusable
            and any(t.node is current.nodes[-1] and uses.get(_key(t)) == 1 and _key(t) not in keep for t in read(node))
        )
        if joins:
            assert current is not None
            current.nodes.append(node)
            continue
        current = Segment([node], read) if fusable else None
        if current is not None:
            segments.append(current)
    return [s for s in segments if len(s.nodes) > 1]


# Constants up to this many elements are written into the loop's source, so
# they cost nothing per call (Numba freezes module-level arrays); larger ones
# are passed in like any other input.
MAX_EMBEDDED = 256


def _literal(value: np.ndarray) -> str:
    """Source for a constant: exact, because float32 -> float64 -> repr round-trips."""
    dtype = value.dtype.name
    if value.size == 1:
        return f"np.{dtype}({_number(float(value.reshape(-1)[0]))})"
    items = ", ".join(_number(float(v)) for v in value.reshape(-1))
    return f"np.array([{items}], dtype=np.{dtype})"


def _number(v: float) -> str:
    """A float as source: repr, except that inf and nan are not names in the generated module."""
    if math.isnan(v):
        return "np.nan"
    if math.isinf(v):
        return "np.inf" if v > 0 else "-np.inf"
    return repr(v)


def _embeddable(segment: Segment, constants: dict[Key, np.ndarray]) -> dict[Key, np.ndarray]:
    """The constant inputs of ``segment`` that its loop's source can hold.

    A one-value constant becomes a literal unless its rank would change the
    output's (broadcasting (1, 1) with (3,) gives (1, 3)); an array must be
    small, and is then indexed like the output.
    """
    rank = len(segment.output.shape)
    keep = {}
    for t in segment.inputs():
        value = constants.get(_key(t))
        if value is None or value.ndim > rank:
            continue
        if value.size == 1 or (value.size <= MAX_EMBEDDED and value.ndim == rank):
            keep[_key(t)] = value
    return keep


def loop_source(
    segment: Segment, constants: dict[Key, np.ndarray] | None = None, scalars: Sequence[bool] | None = None
) -> str:
    """Python source of the fused loop: ``fused(n, out, x0, x1, ...)``.

    One loop per pattern of ``scalars`` (which non-constant inputs hold a
    single value): those are read once, before the loop, and the others at
    ``[i]``, so the loop body is plain unit-stride code that LLVM vectorises.
    Small ``constants`` are written into the source. Every temporary is cast
    back to the segment's dtype, as the op-by-op kernels compute, and
    ``error_model="numpy"`` gives x / 0 = inf (not an exception) without a
    branch per element.
    """
    dtype = segment.output.dtype
    # tanh_ is the vectorisable approximation for float32, libm's tanh for float64;
    # sigmoid_ is the tail-exact logistic function of the segment's precision (float32's over an exp in
    # arithmetic, which LLVM vectorises: kernels/cpu/vector_f32.py).
    scalar = "from cellgraph.dataflow.kernels.cpu.scalar import"
    functions = (
        ["from cellgraph.dataflow.kernels.cpu.vector_f32 import logistic as sigmoid_", f"{scalar} tanh_f32 as tanh_"]
        if dtype == "float32"
        else ["from math import tanh as tanh_", "", f"{scalar} sigmoid_f64 as sigmoid_"]
    )
    parts = loop_body(segment, constants, scalars)
    header = [f"# scalar helpers {_helpers_digest()}", "import math", "", "import numpy as np", "from numba import njit", "",
              *functions, "", f"DT = np.{dtype}"]  # fmt: skip
    lines = [*header, *parts.constants, "", "", '@njit(nogil=True, cache=True, error_model="numpy")']
    lines += [f"def fused(n, out{parts.params}):", *parts.prologue, "    for i in range(n):", *parts.body]
    return "\n".join(lines) + "\n"


@dataclass
class LoopBody:
    """The device-independent parts of a fused loop's source."""

    constants: list[str]  # module-level "Ck = np.array(...)" lines
    params: str  # ", x0, x1": the non-constant inputs
    prologue: list[str]  # one-value inputs, read once before the loop
    body: list[str]  # the loop body: one temporary per node, then the store


def loop_body(
    segment: Segment, constants: dict[Key, np.ndarray] | None = None, scalars: Sequence[bool] | None = None
) -> LoopBody:
    """What every fused loop of ``segment`` computes, for the CPU and CUDA sources to wrap."""
    constants = _embeddable(segment, constants or {})
    dynamic = [t for t in segment.inputs() if _key(t) not in constants]
    scalars = list(scalars) if scalars is not None else [False] * len(dynamic)
    operand: dict[Key, str] = {}
    defined, prologue = [], []
    for k, t in enumerate(segment.inputs()):
        value = constants.get(_key(t))
        if value is not None and value.size == 1:
            operand[_key(t)] = _literal(value)
        elif value is not None:
            defined.append(f"C{k} = {_literal(value)}")
            operand[_key(t)] = f"C{k}[i]"
    for k, (t, scalar) in enumerate(zip(dynamic, scalars, strict=True)):
        if scalar:
            prologue.append(f"    v{k} = x{k}[0]")
            operand[_key(t)] = f"v{k}"
        else:
            operand[_key(t)] = f"x{k}[i]"
    body = []
    for j, node in enumerate(segment.nodes):
        operands = [operand[_key(t)] for t in segment.reads(node)]
        assert node.opdef.elementwise is not None
        # An expression may name the node's attrs too: "{alpha!r}" is LeakyRelu's alpha.
        body.append(f"        t{j} = DT({node.opdef.elementwise.format(*operands, **node.attrs)})")
        operand[_key(node.output(0))] = f"t{j}"
    body.append(f"        out[i] = t{len(segment.nodes) - 1}")
    return LoopBody(defined, "".join(f", x{k}" for k in range(len(dynamic))), prologue, body)


@functools.cache
def _helpers_digest() -> str:
    """A digest of the modules whose functions a fused loop inlines (kernels/cpu/scalar.py, vector_f32.py).

    Numba's cache checks only the cached function's own file: a fused loop cached before a fix to ``tanh_f32``
    kept the old tanh. The digest is written into every loop's source, so a change to the helpers makes new
    files (a new name: compile_loop names them by the source's hash) instead of reusing stale machine code.
    """
    from .kernels.cpu import scalar, vector_f32

    helpers = hashlib.sha256()
    for module in (scalar, vector_f32):
        helpers.update(Path(str(module.__file__)).read_bytes())
    return helpers.hexdigest()[:16]


def _cache_dir() -> Path | None:
    return cache_dir("fused")


_loaded: dict[str, Callable[..., None]] = {}


def compile_loop(source: str) -> Callable[..., None]:
    """The ``fused`` function of ``source``, from a file so Numba can cache its machine code."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:20]
    if digest in _loaded:
        return _loaded[digest]
    directory = _cache_dir()
    if directory is None:  # no writable cache: compile in memory, every process anew
        namespace: dict[str, Any] = {}
        exec(compile(source.replace("cache=True", "cache=False"), f"<fused {digest}>", "exec"), namespace)  # noqa: S102
        fn = namespace["fused"]
    else:
        path = directory / f"fused_{digest}.py"
        if not path.exists():
            with tempfile.NamedTemporaryFile("w", dir=directory, suffix=".tmp", delete=False) as tmp:
                tmp.write(source)
            os.replace(tmp.name, path)  # atomic: concurrent processes never see half a file
        name = f"cellgraph_fused_{digest}"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        # Numba's cache finds a function's globals by module name when it loads.
        sys.modules[name] = module
        spec.loader.exec_module(module)
        # Processes that fuse the same segment at once (a cluster's workers) compile it once between them.
        fn = compile_once(module.fused)
    _loaded[digest] = fn
    return fn


def segment_kernel(
    segment: Segment, node_kernels: Sequence[Callable[..., Any]], constants: dict[Key, np.ndarray] | None = None
) -> Callable[..., np.ndarray]:
    """The callable a plan runs for ``segment``, taking its non-constant inputs:
    the fused loop, or the member kernels one by one when the inputs' shapes
    need real broadcasting."""
    constants = _embeddable(segment, constants or {})
    inputs = segment.inputs()
    dynamic = [t for t in inputs if _key(t) not in constants]
    embedded = [constants[_key(t)] for t in inputs if _key(t) not in {_key(d) for d in dynamic}]
    # Embedded arrays are read at [i]: the output must have their shape.
    required = {c.shape for c in embedded if c.size > 1}
    loops: dict[tuple[bool, ...], Callable[..., None]] = {}
    dtype = np.dtype(segment.output.dtype)
    members = list(zip(segment.nodes, node_kernels, strict=True))

    def one_by_one(*xs: np.ndarray) -> np.ndarray:
        env: dict[Key, Any] = dict(constants)
        env.update((_key(t), x) for t, x in zip(dynamic, xs, strict=True))
        for node, kernel in members:
            env[_key(node.output(0))] = kernel(*(env[_key(t)] for t in segment.reads(node)))
        return np.asarray(env[_key(segment.output)])

    def run(*xs: np.ndarray) -> np.ndarray:
        shapes = [*(x.shape for x in xs), *required]
        shape = max(shapes, key=lambda s: (math.prod(s), len(s))) if shapes else ()
        if len(required) > 1 or (required and shape not in required):
            return one_by_one(*xs)
        args: list[np.ndarray] = []
        pattern = []
        for x in xs:
            if x.shape == shape:
                args.append(x.reshape(-1) if x.flags.c_contiguous else np.ascontiguousarray(x).reshape(-1))
                pattern.append(False)
            elif x.size == 1 and x.ndim <= len(shape):
                args.append(x.reshape(-1))
                pattern.append(True)
            else:
                return one_by_one(*xs)
        key = tuple(pattern)
        loop = loops.get(key)
        if loop is None:
            loop = loops[key] = compile_loop(loop_source(segment, constants, key))
        out = np.empty(shape, dtype)
        loop(out.size, out.reshape(-1), *args)
        return out

    run.inputs = dynamic  # type: ignore[attr-defined]
    return run
