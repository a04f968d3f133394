"""A NaN gradient on a real cluster: skipped and reported with nonfinite="skip_step", never applied."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

import cellgraph as cg
from cellgraph.cluster.cluster import Cluster
from cellgraph.cluster.job import Job

TIMEOUT = 120.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with Cluster.local(workers=1, ps=1) as local:
        yield local


def _loss() -> tuple[cg.Tensor, cg.Tensor]:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 2), "float64", name="x")
        w = cg.variable(np.array([1.0, 2.0]), dtype="float64", name="w")
        return cg.reduce_sum(x * w, name="loss"), w


def _finished_skipping(loss: cg.Tensor, cluster: Cluster, steps: int) -> Job:
    """A job of ``steps`` steps, each skipped: every batch of two rows holds the NaN of ``x``."""
    data = np.array([[1.0, 1.0], [np.nan, 1.0]])
    job = cg.train(
        loss, (data,), cluster=cluster, optimizer=cg.optim.SGD(0.1), replicas=1, batch_size=2, steps=steps,
        checkpoint_every=None, nonfinite="skip_step",
    )  # fmt: skip
    try:
        job.wait(TIMEOUT)
        assert job.status == "finished", job.events
    except BaseException:
        job.close()
        raise
    return job


@pytest.mark.slow
def test_skip_step_drops_every_step_with_a_nan_gradient_and_says_so(cluster: Cluster) -> None:
    loss, _ = _loss()
    job = _finished_skipping(loss, cluster, 5)
    try:
        np.testing.assert_array_equal(job.variables()["w"], [1.0, 2.0])  # nothing applied
        [shard] = job.ps_stats()
        assert shard["global_step"] == 5
        skipped = [e for e in job.events if "skipped" in e and "non-finite gradient" in e]
        assert skipped, job.events
        assert "nonfinite='skip_step' keeps training" in skipped[-1] and "w" in skipped[-1]
    finally:
        job.close()


@pytest.mark.slow
def test_skip_step_with_two_shards_drops_the_step_on_both() -> None:
    """w and v live on different parameter servers; only w's gradient is NaN. Before the replica told every
    shard, v's server applied its half of each step that w's server skipped."""
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 2), "float64", name="x")
        w = cg.variable(np.array([1.0, 2.0]), dtype="float64", name="w")
        v = cg.variable(np.array([3.0, 4.0]), dtype="float64", name="v")
        loss = cg.reduce_sum(x * w, name="xw") + cg.reduce_sum(v * v, name="vv")
    with Cluster.local(workers=1, ps=2) as two:
        job = _finished_skipping(loss, two, 4)
        try:
            where = job.placement.device_of
            assert where["w"] != where["v"] and {where["w"], where["v"]} <= set(job.placement.devices), where
            values = job.variables()
            np.testing.assert_array_equal(values["w"], [1.0, 2.0])
            np.testing.assert_array_equal(values["v"], [3.0, 4.0])  # before: v stepped on its own shard
            assert [s["steps_skipped"] for s in job.ps_stats()] == [4, 4]
        finally:
            job.close()
