"""cg.train on a real LocalCluster: a job trains across processes, reports, stops, and refuses bad arguments."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

import cellgraph as cg
from cellgraph.cluster.cluster import Cluster
from cellgraph.cluster.training_graph import TrainingError
from cellgraph.examples import digits, models

TIMEOUT = 120.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with Cluster.local(workers=2, ps=1) as local:
        yield local


def accuracy(job: cg.Job, model: models.Model, data: digits.Split) -> float:
    logits = job.evaluate(model.logits, {model.x: data.x_test})
    return float((logits.argmax(axis=1) == data.y_test).mean())


@pytest.mark.slow
def test_a_sync_job_trains_the_mlp_across_processes(cluster: Cluster, data: digits.Split) -> None:
    model = models.mlp()
    job = cg.train(
        model.loss, (data.x_train, data.y_train), cluster=cluster, optimizer=cg.optim.Adam(1e-2),
        replicas=2, batch_size=64, steps=300, checkpoint_every=20, metrics_interval_s=0.2,
    )  # fmt: skip
    try:
        job.wait(TIMEOUT)
        assert job.status == "finished"
        assert job.global_step() == 300
        assert accuracy(job, model, data) >= 0.95
        [shard] = job.ps_stats()
        assert shard["address"] == job._state.addresses[0] and shard["global_step"] == 300
        assert shard["updates"] == 300 and shard["pushes_applied"] == 600 and shard["pushes_rejected"] == 0
        assert shard["bytes_in"] > 0 and shard["bytes_out"] > 0, shard
        assert shard["calls"]["Register"] == 2, shard["calls"]
        assert {m["replica"] for m in job.metrics} == {0, 1}
        frame = job.metrics_frame()
        assert len(frame) == len(job.metrics) and set(frame["replica"]) == {0, 1}
        assert frame["ps_bytes"].max() > 0 and frame["step"].max() == 300
        assert any(m.get("final") for m in job.metrics)
        # Up to 15 checkpoints were written (a busy writer skips one) and the servers keep their newest 5: the
        # job lists those that exist. The events come from looks at the servers, which see only the newest.
        assert shard["checkpoints_written"] > 5, shard
        assert any("checkpoint ckpt-" in e and " written " in e for e in job.events), job.events
        on_disk = sorted(p.name for p in job.checkpoint_dir.iterdir() if p.name.startswith("ckpt-"))
        assert job.checkpoints == on_disk and len(on_disk) <= 5 and job.checkpoints[-1] == "ckpt-0000000300"
        # The job's token opens its servers: it is in no repr, event or summary.
        token = job._state.token
        shown = [repr(job), repr(job._state), repr(job._state.spec), repr(job._state.specs[0]), *job.events]
        shown.append(str(job._repr_mimebundle_().get("text/plain", "")))
        assert token and not [text for text in shown if token in text]
        assert any("finished at global step 300" in e for e in job.events)
    finally:
        job.close()


@pytest.mark.slow
def test_stop_ends_the_job_early_with_a_final_checkpoint(cluster: Cluster, data: digits.Split) -> None:
    model = models.mlp()
    job = cg.train(
        model.loss, (data.x_train, data.y_train), cluster=cluster, mode="async",
        replicas=2, batch_size=32, steps=1_000_000, checkpoint_every=1,
    )  # fmt: skip
    try:
        deadline = TIMEOUT
        import time

        start = time.monotonic()
        while job.global_step() < 40 and time.monotonic() - start < deadline:
            time.sleep(0.1)
        job.stop(timeout=TIMEOUT)
        assert job.status == "stopped"
        assert job.global_step() < 1_000_000
        assert job.checkpoints and any("final" in e for e in job.events)
        # A checkpoint every step is several between two looks at the servers (every 0.2 s): the event counts them.
        assert any("steps; " in e and " since the last look) in " in e for e in job.events), job.events
    finally:
        job.close()


def test_bad_arguments_fail_before_anything_starts(cluster: Cluster, data: digits.Split) -> None:
    model = models.mlp()
    xy = (data.x_train, data.y_train)
    cases = [
        (dict(replicas=3), "3 replicas need 3 training workers and the cluster has 2: pass replicas=2"),
        (dict(batch_size=10_000), "batch_size 10000 is larger than a replica's shard"),
        (dict(mode="sync", replicas_to_aggregate=3), "replicas_to_aggregate must be between 1 and replicas (2), got 3"),
    ]
    for kwargs, words in cases:
        with pytest.raises(TrainingError) as err:
            cg.train(model.loss, xy, cluster=cluster, **kwargs)  # type: ignore[arg-type]
        assert words in str(err.value)
    with pytest.raises(TrainingError, match=r"data has 1 array\(s\) but the loss needs 2 placeholder\(s\)"):
        cg.train(model.loss, (data.x_train,), cluster=cluster)
    with pytest.raises(TrainingError, match="no data for placeholder"):
        cg.train(model.loss, {model.x: data.x_train}, cluster=cluster)
    with pytest.raises(TrainingError, match="cg.train needs an open cluster"):
        cg.train(model.loss, xy, cluster=None)  # type: ignore[arg-type]
    # Nothing was started: no parameter servers, no tasks.
    assert cluster._jobs == {}


def test_metrics_frame_without_pandas_says_what_to_install(
    cluster: Cluster, data: digits.Split, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = models.mlp()
    job = cg.train(model.loss, (data.x_train, data.y_train), cluster=cluster, replicas=2, batch_size=32, steps=10)
    try:
        job.wait(TIMEOUT)
        monkeypatch.setitem(sys.modules, "pandas", None)  # what an environment without pandas gives `import pandas`
        with pytest.raises(
            TrainingError, match=r"job.metrics_frame\(\) needs pandas \(pip install pandas\); job.metrics"
        ):
            job.metrics_frame()
    finally:
        job.close()


def test_close_lets_a_bug_through_and_can_run_again(cluster: Cluster, data: digits.Split) -> None:
    model = models.mlp()
    job = cg.train(model.loss, (data.x_train, data.y_train), cluster=cluster, replicas=2, batch_size=32, steps=10)
    job.wait(TIMEOUT)
    ps = job._state.ps
    assert ps is not None
    real_close = ps.close

    def broken() -> None:
        raise AttributeError("a bug in closing the parameter client")

    ps.close = broken  # type: ignore[method-assign]
    try:
        # An AttributeError is a bug, not a sign of a closed cluster: close() raises it instead of swallowing it.
        with pytest.raises(AttributeError, match="a bug in closing the parameter client"):
            job.close()
    finally:
        ps.close = real_close  # type: ignore[method-assign]
        real_close()
        cluster.stop_parameter_servers(job.job_id)
        cluster.forget_on_close(job.job_id)
    assert cluster._jobs == {}
