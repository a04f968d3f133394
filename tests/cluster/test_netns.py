"""Multi-host on one machine: a scheduler, a PS and two workers, each in its own network namespace.

Linux network namespaces joined by veth pairs to one bridge
(``cellgraph.testing.netns``) give every process its own address (10.77.x.y),
as on separate machines; only the test's own addresses are used. Training
runs across them; then one worker's link is cut mid-job and the job goes on
with the rest. This is the rehearsal for a real
multi-machine cluster. It needs root (CAP_NET_ADMIN) and iproute2; where the
test cannot create namespaces it is skipped, saying why.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

import cellgraph as cg
from cellgraph.examples import digits, models
from cellgraph.testing.netns import Hosts, cannot_make_namespaces, connect, dask_cluster

START_S = 60.0
TIMEOUT_S = 180.0


@pytest.fixture(scope="module")
def hosts() -> Iterator[Hosts]:
    why = cannot_make_namespaces()
    if why:
        pytest.skip(f"no network namespaces: {why}")
    with dask_cluster(workers=2) as made:
        yield made


@pytest.mark.slow
def test_training_runs_across_hosts_and_survives_a_cut_link(hosts: Hosts) -> None:
    cluster = connect(hosts, workers=3, timeout=START_S)
    try:
        workers = {w.address.split("//")[1].split(":")[0]: w.role for w in cluster.workers()}
        assert workers == {
            hosts.addresses["ps"]: "ps",
            hosts.addresses["worker0"]: "worker",
            hosts.addresses["worker1"]: "worker",
        }
        data = digits.load()
        model = models.mlp()
        job = cg.train(
            model.loss, (data.x_train, data.y_train), cluster=cluster, optimizer=cg.optim.Adam(1e-2),
            replicas=2, replicas_to_aggregate=1, batch_size=32, steps=600, checkpoint_every=None,
        )  # fmt: skip
        try:
            start = time.monotonic()
            while job.global_step() < 100:  # waits for the job's start first
                assert time.monotonic() - start < TIMEOUT_S, "the job did not reach step 100"
                time.sleep(0.2)
            # Every process has its own address: the PS answers on the PS host's.
            assert all(a.startswith(hosts.addresses["ps"] + ":") for a in job._ps.addresses)  # type: ignore[union-attr]
            hosts.cut("worker1")
            job.wait(TIMEOUT_S)
            assert job.status == "finished" and job.global_step() == 600
            logits = job.evaluate(model.logits, {model.x: data.x_test})
            assert (logits.argmax(axis=1) == data.y_test).mean() >= 0.9
        finally:
            job.close()
    finally:
        cluster.close()
