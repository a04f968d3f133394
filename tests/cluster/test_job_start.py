"""``cg.train`` returns while its job starts (issue 18, item 15): the start runs on the job's own thread.

What can be checked in the caller still raises there; what fails during the
start fails the job with the start's words (``job.status``, ``job.wait()``,
an event); a job closed while it starts closes in order. States are
asserted, never timings.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import cellgraph as cg
from cellgraph.cluster.cluster import Cluster
from cellgraph.cluster.training_graph import TrainingError
from cellgraph.examples import digits, models
from tests.deadlines import unless_it_hangs

TIMEOUT = 120.0  # a hang guard and the jobs' deadline, never a measure of speed


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with Cluster.local(workers=2, ps=1, timeout=TIMEOUT) as local:
        yield local


@pytest.mark.slow
def test_train_returns_while_the_job_starts_and_a_failed_start_raises_its_words_in_wait(
    cluster: Cluster, data: digits.Split, tmp_path: Path
) -> None:
    # A folder of the right name passes the caller's checks; that it holds no checkpoint only the servers find out.
    (tmp_path / "ckpt-0000000040").mkdir()
    model = models.mlp()
    job = cg.train(
        model.loss, (data.x_train, data.y_train), cluster=cluster, replicas=2, batch_size=32, steps=50,
        checkpoint_dir=tmp_path, resume_from="ckpt-0000000040",
    )  # fmt: skip
    try:
        # Returned before the start: the parameter servers were not even asked yet, or are being started.
        assert job.status == "starting", job.events
        with pytest.raises(TrainingError) as info:
            job.wait(TIMEOUT)
        message = str(info.value)
        assert message.startswith(f"job {job.job_id} could not start: "), message
        assert "ckpt-0000000040" in message, message  # the servers' own words about the checkpoint
        assert job.status == "failed"
        assert message in job.events[-1]  # the monitor's events panel says it too
        assert job._state.futures == [] and job._state.ps is None  # nothing of it runs
        with pytest.raises(TrainingError, match=f"^job {job.job_id} could not start: "):
            job.wait(TIMEOUT)  # as often as it is asked
    finally:
        job.close()
    assert cluster._jobs == {}  # its servers were stopped


@pytest.mark.slow
def test_close_while_the_job_starts_is_orderly_and_the_cluster_trains_on(
    cluster: Cluster, data: digits.Split, capfd: pytest.CaptureFixture[str]
) -> None:
    model = models.mlp()
    job = cg.train(model.loss, (data.x_train, data.y_train), cluster=cluster, replicas=2, batch_size=32, steps=10**6)
    assert job.status == "starting"
    unless_it_hangs(job.close, TIMEOUT, "job.close() during the start")
    assert job.status == "stopped", job.events
    assert job._state.ps is None and all(f.status in ("cancelled", "finished") for f in job._state.futures)
    assert cluster._jobs == {}
    job.close()  # twice: nothing more
    second = cg.train(model.loss, (data.x_train, data.y_train), cluster=cluster, replicas=2, batch_size=32, steps=5)
    try:
        second.wait(TIMEOUT)
        assert second.status == "finished" and second.global_step() == 5
    finally:
        second.close()
    _, errors = capfd.readouterr()
    assert "Traceback" not in errors and "Exception in thread" not in errors, errors[-3000:]


def test_a_cluster_without_parameter_servers_is_refused_in_the_caller(cluster: Cluster, data: digits.Split) -> None:
    view = Cluster.from_client(cluster.client)
    try:
        view.assign(ps=0)
        with pytest.raises(TrainingError) as info:
            cg.train(models.mlp().loss, (data.x_train, data.y_train), cluster=view, replicas=2, steps=5)
        assert "the cluster has no parameter-server worker: start it with Cluster.local(ps=1), give workers the " in (
            str(info.value)
        )
        assert "Dask resource 'ps', call cluster.assign(ps=...), or pass ps_placement='colocated'" in str(info.value)
        assert cluster._jobs == {} and view._jobs == {}  # nothing started
    finally:
        view.close()


# A first job on a fresh machine (empty caches): this process compiles the replicas' step beside them and says so.
FRESH_MACHINE = """
import re, sys
import cellgraph as cg
from cellgraph.examples import digits, models
data = digits.load()
with cg.Cluster.local(workers=1, ps=1, timeout=120) as cluster:
    job = cg.train(models.mlp().loss, (data.x_train, data.y_train), cluster=cluster, replicas=1, steps=5)
    try:
        job.wait(240)
        print(job.status, job.compiling == "")
        print([e.split(" ", 1)[1] for e in job.events if "kernels" in e])
    finally:
        job.close()
"""


@pytest.mark.slow
def test_a_first_job_on_a_fresh_machine_compiles_its_kernels_here_and_says_so(tmp_path: Path) -> None:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba"), "CELLGRAPH_CACHE_DIR": str(tmp_path / "cg")}
    ran = subprocess.run(
        [sys.executable, "-c", FRESH_MACHINE], env=env, capture_output=True, text=True, timeout=2 * TIMEOUT
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    status, events = ran.stdout.strip().splitlines()[-2:]
    assert status == "finished True"  # trained; and job.compiling is empty once the kernels are ready
    [ready] = [e for e in ast.literal_eval(events) if e.startswith("kernels ready in ")]
    compiled, loaded = map(
        int, re.fullmatch(r"kernels ready in [0-9.]+ s: (\d+) compiled, (\d+) loaded from the cache", ready).groups()
    )  # type: ignore[union-attr]
    # Every kernel of the step became ready here, compiled here or loaded from what the replica compiled first.
    assert compiled + loaded >= 5, ready
    assert len(list((tmp_path / "numba").rglob("*.nbi.lock"))) >= compiled  # each kernel compiled under its lock
    assert len(list((tmp_path / "cg" / "compiled").glob("step-*"))) == 1  # this step's kernels are in the caches
    # The same step again: the replicas load the warm caches themselves, and this process leaves them a core.
    again = subprocess.run(
        [sys.executable, "-c", FRESH_MACHINE], env=env, capture_output=True, text=True, timeout=2 * TIMEOUT
    )
    assert again.returncode == 0, again.stderr[-3000:]
    status, events = again.stdout.strip().splitlines()[-2:]
    assert status == "finished True" and ast.literal_eval(events) == [], events
