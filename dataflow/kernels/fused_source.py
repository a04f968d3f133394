"""The source of a fused elementwise loop, and its compiled function: what the CPU and CUDA kernels of a segment
share.

A ``Segment`` is a run of elementwise nodes that ``dataflow/fusion.py`` (the
pass) found; the last one's output is the segment's. ``loop_body`` writes what
every loop of the segment computes, one temporary per node (each op's
``OpDef.elementwise`` expression), with small constants written into the
source; ``loop_source`` wraps it as a CPU ``@njit`` loop, and
``kernels/cuda/fusion.py`` as a CUDA kernel. ``compile_loop`` loads a source's
``fused`` function from a file, so that Numba caches its machine code across
processes.

Examples
--------
>>> import cellgraph as cg
>>> g = cg.Graph()
>>> with g.as_default():
...     x = cg.placeholder((4,), name="x")
...     y = cg.relu(cg.exp(x))
>>> body = loop_body(Segment([y.node.inputs[0].node, y.node]))
>>> body.params, len(body.body)
(', x0', 3)
>>> body.body[-1]
'        out[i] = t1'
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

from ..graph import Node, Tensor
from .compile_once import cache_dir, compile_once

Key = tuple[int, int]


def tensor_key(t: Tensor) -> Key:
    """A tensor's identity in a segment: its node's id and its output index."""
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

    def strict(self) -> bool:
        """Whether a member of several operands does not broadcast (an activation's gradient of dy and y): a
        single-value input may then not stand for a whole tensor, so the fused loop is not run for one."""
        return any(not n.opdef.broadcasts and len(self.reads(n)) > 1 for n in self.nodes)

    def inputs(self) -> list[Tensor]:
        """Tensors the segment reads from outside, each once, in first-use order."""
        inside = {id(n) for n in self.nodes}
        seen: dict[Key, Tensor] = {}
        for node in self.nodes:
            for t in self.reads(node):
                if id(t.node) not in inside:
                    seen.setdefault(tensor_key(t), t)
        return list(seen.values())


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


def embeddable(segment: Segment, constants: dict[Key, np.ndarray]) -> dict[Key, np.ndarray]:
    """The constant inputs of ``segment`` that its loop's source can hold.

    A one-value constant becomes a literal unless its rank would change the
    output's (broadcasting (1, 1) with (3,) gives (1, 3)); an array must be
    small, and is then indexed like the output.
    """
    rank = len(segment.output.shape)
    keep = {}
    for t in segment.inputs():
        value = constants.get(tensor_key(t))
        if value is None or value.ndim > rank:
            continue
        if value.size == 1 or (value.size <= MAX_EMBEDDED and value.ndim == rank):
            keep[tensor_key(t)] = value
    return keep


def embedded_layout(embedded: Sequence[tuple[int, ...]]) -> tuple[frozenset[tuple[int, ...]], int]:
    """What constants written into a fused loop ask of its output, worked out once per kernel: the shapes of
    the arrays read at ``[i]`` (any size but 1, an empty one too: the output must have their shape), and the
    highest rank of the one-value ones (literals, whose rank still counts: ``x + [[2.0]]`` of a scalar ``x``
    is (1, 1))."""
    required = frozenset(s for s in embedded if math.prod(s) != 1)
    return required, max((len(s) for s in embedded if math.prod(s) == 1), default=0)


def loop_shape(
    dynamic: Sequence[tuple[int, ...]], required: frozenset[tuple[int, ...]], rank: int
) -> tuple[int, ...] | None:
    """The output shape of a fused loop over inputs of shapes ``dynamic`` and embedded constants
    (``embedded_layout``); None when the inputs need real broadcasting (the member kernels then run one by
    one)."""
    candidates = [*dynamic, *required] if required else dynamic
    shape = max(candidates, key=lambda s: (math.prod(s), len(s))) if candidates else ()
    if len(shape) < rank:
        shape = (1,) * (rank - len(shape)) + shape
    if len(required) > 1 or (required and shape not in required):
        return None
    return shape


def fills(x: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    """Whether an input of shape ``x`` holds the output's elements in its order: ``shape`` itself, or it with
    its leading 1s left out."""
    return x == shape or (
        len(x) < len(shape) and x == shape[len(shape) - len(x) :] and math.prod(x) == math.prod(shape)
    )


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
    constants = embeddable(segment, constants or {})
    dynamic = [t for t in segment.inputs() if tensor_key(t) not in constants]
    scalars = list(scalars) if scalars is not None else [False] * len(dynamic)
    operand: dict[Key, str] = {}
    defined, prologue = [], []
    for k, t in enumerate(segment.inputs()):
        value = constants.get(tensor_key(t))
        if value is not None and value.size == 1:
            operand[tensor_key(t)] = _literal(value)
        elif value is not None:
            defined.append(f"C{k} = {_literal(value)}")
            operand[tensor_key(t)] = f"C{k}[i]"
    for k, (t, scalar) in enumerate(zip(dynamic, scalars, strict=True)):
        if scalar:
            prologue.append(f"    v{k} = x{k}[0]")
            operand[tensor_key(t)] = f"v{k}"
        else:
            operand[tensor_key(t)] = f"x{k}[i]"
    body = []
    for j, node in enumerate(segment.nodes):
        operands = [operand[tensor_key(t)] for t in segment.reads(node)]
        assert node.opdef.elementwise is not None
        # An expression may name the node's attrs too: "{alpha!r}" is LeakyRelu's alpha.
        body.append(f"        t{j} = DT({node.opdef.elementwise.format(*operands, **node.attrs)})")
        operand[tensor_key(node.output(0))] = f"t{j}"
    body.append(f"        out[i] = t{len(segment.nodes) - 1}")
    return LoopBody(defined, "".join(f", x{k}" for k in range(len(dynamic))), prologue, body)


@functools.cache
def _helpers_digest() -> str:
    """A digest of the modules whose functions a fused loop inlines (kernels/cpu/scalar.py, vector_f32.py).

    Numba's cache checks only the cached function's own file: a fused loop cached before a fix to ``tanh_f32``
    kept the old tanh. The digest is written into every loop's source, so a change to the helpers makes new
    files (a new name: compile_loop names them by the source's hash) instead of reusing stale machine code.
    """
    from .cpu import scalar, vector_f32

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
