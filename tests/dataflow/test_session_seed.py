"""A session's seed: mixed into every random op's own, so that the replicas of a job draw different dropout
masks (in one process, the rows of one batch of 2b get independent masks; two replicas of b must too)."""

from __future__ import annotations

import numpy as np
import pytest

import cellgraph as cg
from cellgraph.dataflow.opdef import session_seeded


def _masks(seed: int | None, runs: int = 2, partitioned: bool = False) -> list[np.ndarray]:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((4, 64), name="x")
        y = cg.dropout(x, 0.5, seed=11)
    if partitioned:
        sess: cg.Session | cg.PartitionedSession = cg.PartitionedSession(
            g, {n.name: "/job:worker/task:0/device:cpu:0" for n in g.nodes}, seed=seed
        )
    else:
        sess = cg.Session(g, seed=seed)
    return [sess.run(y, {x: np.ones((4, 64), np.float32)}) != 0 for _ in range(runs)]


@pytest.mark.parametrize("partitioned", [False, True])
def test_sessions_of_different_seeds_draw_different_masks_and_each_replays_its_own(partitioned: bool) -> None:
    unseeded, one, two = (_masks(seed, partitioned=partitioned) for seed in (None, 1, 2))
    assert not np.array_equal(one[0], two[0]) and not np.array_equal(one[0], unseeded[0])
    assert not np.array_equal(one[0], one[1])  # each run of a session still draws a new mask
    np.testing.assert_array_equal(_masks(1, partitioned=partitioned), one)  # a new session of the same seed replays
    np.testing.assert_array_equal(_masks(None, partitioned=partitioned), unseeded)
    kept = np.mean([m.mean() for m in (*one, *two)])
    assert abs(kept - 0.5) < 0.05, kept  # still dropout at rate 0.5: 2,048 draws


def test_no_session_seed_keeps_the_ops_own_seed() -> None:
    # The reference (the op's seed alone) is what an unseeded session draws: single-process numbers unchanged.
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((3, 5), name="x")
        y = cg.dropout(x, 0.3, seed=5)
    ones = np.ones((3, 5), np.float32)
    expected = y.node.opdef.reference(y.node.attrs, ones)[0]
    np.testing.assert_array_equal(cg.Session(g).run(y, {x: ones}), expected)
    assert session_seeded(5, None) == 5 and session_seeded(5, 1) != session_seeded(5, 2)
    assert session_seeded(5, -1) == session_seeded(5, -1)  # negative seeds are fine, as NumPy's are not


@pytest.mark.parametrize("bad", [1.5, "1", True])
def test_a_seed_that_is_not_an_int_is_refused(bad: object) -> None:
    g = cg.Graph()
    with pytest.raises(cg.GraphError, match=rf"Session: seed must be an int or None, got {bad!r}"):
        cg.Session(g, seed=bad)  # type: ignore[arg-type]
    with pytest.raises(cg.GraphError, match=rf"PartitionedSession: seed must be an int or None, got {bad!r}"):
        cg.PartitionedSession(g, {}, seed=bad)  # type: ignore[arg-type]
