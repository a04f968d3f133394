"""Elementwise kernels run on their operands' fewest dimensions: the same numbers, low-rank compiles.

Numba compiles an array expression once per rank and dtype of its operands,
and a 4-D one takes about 7 s here against 0.3 s for 1-D. Before, a model's
4-D adds, multiplies and activations each compiled a 4-D loop; now same-shaped
operands go in as 1-D views and broadcast ones with their alike dimensions
merged (``ops/base.py``, ``on_fewest_dims``).
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from cellgraph.dataflow.kernels.cpu import elementwise as ew
from cellgraph.dataflow.ops.base import _fewest_dims, on_fewest_dims


@pytest.mark.parametrize(
    ("shapes", "merged"),
    [
        (((4, 5, 6, 7), (4, 5, 6, 7)), ((840,), (840,))),
        (((4, 5, 6, 7), (7,)), ((120, 7), (1, 7))),
        (((4, 5, 6, 7), (4, 1, 1, 7)), ((4, 30, 7), (4, 1, 7))),
        (((2, 3), ()), ((6,), (1,))),
        (((1, 1), (1, 1)), ((1,), (1,))),
        (((0, 3), (3,)), ((0, 3), (1, 3))),
        (((2, 3, 4), (2, 3, 4), (1, 1, 4)), ((6, 4), (6, 4), (1, 4))),
    ],
)
def test_alike_dimensions_merge(shapes: tuple[tuple[int, ...], ...], merged: tuple[tuple[int, ...], ...]) -> None:
    plan = _fewest_dims(shapes)
    assert plan is not None
    assert plan[0] == merged
    assert plan[1] == np.broadcast_shapes(*shapes)


@pytest.mark.parametrize("shapes", [((3,), (3,)), ((5, 1, 3), (1, 4, 3)), ((2, 3), (4, 3))])
def test_shapes_with_nothing_to_merge_or_that_do_not_broadcast_are_left_alone(
    shapes: tuple[tuple[int, ...], ...],
) -> None:
    assert _fewest_dims(shapes) is None


def test_the_numbers_are_numpys_for_every_layout() -> None:
    rng = np.random.default_rng(0)
    add, neg, where = on_fewest_dims(ew.add, 2), on_fewest_dims(ew.neg, 1), on_fewest_dims(np.where, 3)
    x = rng.standard_normal((3, 4, 5, 6)).astype(np.float32)
    cases = [
        (x, x[::-1].copy()),  # same shape
        (x, rng.standard_normal(6).astype(np.float32)),  # a bias
        (x, rng.standard_normal((3, 1, 1, 6)).astype(np.float32)),  # per example and channel
        (x, np.float32(2.0) * np.ones((), np.float32)),  # a 0-d operand
        (x.transpose(0, 2, 1, 3), rng.standard_normal((3, 5, 4, 6)).astype(np.float32)),  # not C-contiguous
        (np.zeros((0, 6), np.float32), np.ones(6, np.float32)),  # no elements
    ]
    for a, b in cases:
        out = add(a, b)
        np.testing.assert_array_equal(out, a + b)
        assert out.shape == np.broadcast_shapes(a.shape, b.shape) and out.dtype == np.float32
    np.testing.assert_array_equal(neg(x), -x)
    np.testing.assert_array_equal(neg(x.transpose(3, 2, 1, 0)), -x.transpose(3, 2, 1, 0))
    cond = x > 0
    np.testing.assert_array_equal(where(cond, x, np.zeros(6, np.float32)), np.where(cond, x, 0))


# Run in a process of its own: a kernel's signatures are those compiled or loaded by the process, and other
# tests may call the kernels directly on 4-D arrays.
_RANKS_SEEN = """
import json
import numpy as np
import cellgraph as cg
from cellgraph.dataflow.kernels.cpu import elementwise as ew
g = cg.Graph()
with g.as_default():
    x = cg.placeholder((None, 4, 4, 3), "float64", name="x")
    b = cg.constant(np.arange(3.0), "float64", name="b")
    y = cg.exp(x - b) * x  # same-shaped and broadcast operands, a unary op: each its own node
value = np.random.default_rng(1).standard_normal((2, 4, 4, 3))
np.testing.assert_allclose(cg.Session(g, fuse=False).run(y, {x: value}), np.exp(value - np.arange(3.0)) * value)
print(json.dumps({k.__name__: sorted({a.ndim for sig in k.signatures for a in sig}) for k in (ew.sub, ew.exp, ew.mul)}))
"""


def test_a_4d_graph_compiles_no_4d_elementwise_loop() -> None:
    done = subprocess.run([sys.executable, "-c", _RANKS_SEEN], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    ranks = json.loads(done.stdout.strip().splitlines()[-1])
    assert all(seen and max(seen) < 4 for seen in ranks.values()), ranks
