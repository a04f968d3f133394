"""Elementwise fusion: a run of elementwise ops becomes one Numba loop.

Each op that declares a scalar expression (``OpDef.elementwise``) may join the
segment of the op that feeds it, when that op's output is used by nothing
else. A segment compiles to one ``@njit`` function that reads every external
input once and writes one output, so a 200-op chain costs one call instead of
200 and no intermediate buffer. Inputs must have the output's shape or hold a
single value; anything else (true broadcasting, say (3, 1) + (1, 4)) runs the
ops one by one, exactly as without fusion.

This module is the pass (which nodes join a segment) and the kernel a plan
runs for a segment on the CPU; the loop's source and its compilation are
``kernels/fused_source.py``, which the CUDA kernels share.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .graph import Node, Tensor
from .kernels.fused_source import (
    Key,
    Segment,
    compile_loop,
    embeddable,
    embedded_layout,
    fills,
    loop_shape,
    loop_source,
    tensor_key,
)


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
            uses[tensor_key(t)] = uses.get(tensor_key(t), 0) + 1
    segments: list[Segment] = []
    current: Segment | None = None
    for node in order:
        if is_constant(node):
            continue
        fusable = _fusable(node) and id(node) not in skip
        joins = (
            current is not None
            and fusable
            and any(
                t.node is current.nodes[-1] and uses.get(tensor_key(t)) == 1 and tensor_key(t) not in keep
                for t in read(node)
            )
        )
        if joins:
            assert current is not None
            current.nodes.append(node)
            continue
        current = Segment([node], read) if fusable else None
        if current is not None:
            segments.append(current)
    return [s for s in segments if len(s.nodes) > 1]


def segment_kernel(
    segment: Segment, node_kernels: Sequence[Callable[..., Any]], constants: dict[Key, np.ndarray] | None = None
) -> Callable[..., np.ndarray]:
    """The callable a plan runs for ``segment``, taking its non-constant inputs:
    the fused loop, or the member kernels one by one when the inputs' shapes
    need real broadcasting."""
    constants = embeddable(segment, constants or {})
    inputs = segment.inputs()
    dynamic = [t for t in inputs if tensor_key(t) not in constants]
    embedded = [constants[tensor_key(t)] for t in inputs if tensor_key(t) not in {tensor_key(d) for d in dynamic}]
    required, rank = embedded_layout([c.shape for c in embedded])
    loops: dict[tuple[bool, ...], Callable[..., None]] = {}
    dtype = np.dtype(segment.output.dtype)
    members = list(zip(segment.nodes, node_kernels, strict=True))
    # A (1,) y for a (3,) dy was broadcast by the loop, where the members one by one refuse it (their kernels
    # check the shapes): such a segment runs a single-value input through them.
    strict = segment.strict()

    def one_by_one(*xs: np.ndarray) -> np.ndarray:
        env: dict[Key, Any] = dict(constants)
        env.update((tensor_key(t), x) for t, x in zip(dynamic, xs, strict=True))
        for node, kernel in members:
            env[tensor_key(node.output(0))] = kernel(*(env[tensor_key(t)] for t in segment.reads(node)))
        return np.asarray(env[tensor_key(segment.output)])

    def run(*xs: np.ndarray) -> np.ndarray:
        shape = loop_shape([x.shape for x in xs], required, rank)
        if shape is None:
            return one_by_one(*xs)
        args: list[np.ndarray] = []
        pattern = []
        for x in xs:
            if fills(x.shape, shape):
                args.append(x.reshape(-1) if x.flags.c_contiguous else np.ascontiguousarray(x).reshape(-1))
                pattern.append(False)
            elif x.size == 1 and x.ndim <= len(shape) and not strict:
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
