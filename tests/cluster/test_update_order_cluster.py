"""On a cluster too, every gradient of a step reads the values from before the step.

The replicas compute all gradients from the values they pulled, and the
parameter servers apply them afterwards; the expected values come from the
NumPy model in tests/dataflow/test_update_order.py, not from cellgraph.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

import cellgraph as cg
from cellgraph.cluster.cluster import Cluster

from ..dataflow.test_update_order import INIT, OPTIMIZERS, STEPS, X, _numpy_trajectory

TIMEOUT = 120.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with Cluster.local(workers=1, ps=2) as local:
        yield local


@pytest.mark.slow
@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_a_cluster_step_reads_the_values_from_before_the_step(cluster: Cluster, name: str) -> None:
    make, numpy_step = OPTIMIZERS[name]
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 4), "float64", name="x")
        s = cg.variable(INIT["s"], dtype="float64", name="s")
        a = cg.variable(INIT["A"], dtype="float64", name="A")
        b = cg.variable(INIT["B"], dtype="float64", name="B")
        loss = cg.reduce_sum(s * (x @ a) * (x @ b), name="loss")
    # One replica whose every batch is all six rows: the loss is a sum, so the
    # order the rows come in does not matter.
    job = cg.train(
        loss, (X,), cluster=cluster, optimizer=make(), replicas=1, batch_size=len(X), steps=STEPS,
        checkpoint_every=None,
    )  # fmt: skip
    try:
        job.wait(TIMEOUT)
        assert job.status == "finished", job.events
        got = job.variables()
        want = _numpy_trajectory(numpy_step)
        for k in ("A", "B", "s"):
            np.testing.assert_allclose(got[k], want[k], rtol=1e-9, atol=1e-12, err_msg=k)
    finally:
        job.close()
