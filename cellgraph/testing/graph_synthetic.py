"""A generated graph of any size, for trying GraphView on something large and for its benchmark."""

from __future__ import annotations

import cellgraph as cg
from cellgraph.dataflow.graph import Graph

WORKERS = ("/job:worker/task:0/device:cpu:0", "/job:worker/task:1/device:cpu:0")
_STEPS = ("add", "mul", "relu", "tanh")


def synthetic_graph(stages: int = 20, blocks: int = 10, ops_per_block: int = 50, width: int = 16) -> Graph:
    """``stages`` scopes of ``blocks`` scopes of ``ops_per_block`` nodes, plus the input ``x``.

    Each block is a chain of elementwise ops with a skip connection every
    seven steps; stages alternate between two worker tasks, so placing the
    graph on ``WORKERS`` gives cross-device edges. The defaults make 10,001
    nodes. Names are numbered without ``_N`` suffixes, so nothing folds.

    Examples
    --------
    >>> g = synthetic_graph(stages=2, blocks=2, ops_per_block=5)
    >>> len(g), g.nodes[1].name
    (21, 'stage00/block00/scale')
    """
    g = Graph()
    with g.as_default():
        h = cg.placeholder((None, width), name="x")
        for s in range(stages):
            with cg.name_scope(f"stage{s:02d}"), cg.device(WORKERS[s % len(WORKERS)]):
                for b in range(blocks):
                    with cg.name_scope(f"block{b:02d}"):
                        h = _block(h, ops_per_block)
    return g


def _block(h: cg.Tensor, ops: int) -> cg.Tensor:
    scale = cg.constant(0.5, name="scale")
    history = [h]
    for k in range(ops - 1):
        step = _STEPS[k % len(_STEPS)]
        name = f"{step}{k:02d}"
        if step == "add":
            h = cg.add(h, history[max(0, len(history) - 7)], name=name)
        elif step == "mul":
            h = cg.mul(h, scale, name=name)
        else:
            h = getattr(cg, step)(h, name=name)
        history.append(h)
    return h
