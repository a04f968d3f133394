"""Controlling a running job on a real LocalCluster: stop in sync mode, scale up and down, resume from a checkpoint."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest

import cellgraph as cg
from cellgraph.cluster.cluster import Cluster
from cellgraph.cluster.job import Job
from cellgraph.cluster.training_graph import TrainingError
from cellgraph.examples import digits, models

TIMEOUT = 120.0
# A stop must not wait for a server-side deadline (60 s by default): well under it.
STOP_TIMEOUT = 30.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with Cluster.local(workers=3, ps=1) as local:
        yield local


def wait_until(check: Callable[[], bool], what: str, job: Job) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"still waiting after {TIMEOUT} s for {what}; events:\n" + "\n".join(job.events))
        time.sleep(0.05)


def start(cluster: Cluster, data: digits.Split, **options: object) -> Job:
    settings: dict[str, object] = dict(
        optimizer=cg.optim.Adam(1e-2), replicas=2, batch_size=32, steps=1_000_000, checkpoint_every=50
    )
    settings.update(options)
    model = models.mlp()
    return cg.train(model.loss, (data.x_train, data.y_train), cluster=cluster, **settings)  # type: ignore[arg-type]


@pytest.mark.slow
def test_stop_in_sync_mode_releases_a_replica_waiting_for_the_others(cluster: Cluster, data: digits.Split) -> None:
    job = start(cluster, data)
    try:
        wait_until(lambda: job.global_step() >= 30, "step 30", job)
        job.stop(timeout=STOP_TIMEOUT)  # raises if a replica still waits for a gradient that will not come
        assert job.status == "stopped"
        assert all(f.result()["stopped"] for f in job._state.futures)
        events = "\n".join(job.events)
        assert "1 gradient(s) make a step from now on: the job is stopping" in events
        assert "checkpoint ckpt-" in events and "written (final)" in events
        assert job.global_step() < 1_000_000
        before = list(job.events)
        assert job.stop() is job and job.status == "stopped" and job.events == before  # again: nothing to do
    finally:
        job.close()


@pytest.mark.slow
def test_evaluate_infers_with_every_training_switch_off_unless_fed(cluster: Cluster, data: digits.Split) -> None:
    # As Keras's evaluate: batch norm by its moving statistics, whatever the batch. Evaluated with the switch on,
    # a batch-norm model scored by its test set's own statistics, and the demo reported that number.
    g = cg.Graph()

    def model(activation: Callable[[cg.Tensor], cg.Tensor]) -> tuple[cg.Tensor, ...]:
        with g.as_default(), cg.cell_scope("model-cell"):  # as a notebook cell, which a re-run re-makes
            x = cg.placeholder((None, 64), name="x")
            y = cg.placeholder((None,), "int32", name="y")
            training = cg.layers.training_switch()
            h = cg.layers.batch_norm(cg.layers.dense(x, 16, name="hidden"), training, momentum=0.5, name="bn")
            logits = cg.layers.dense(activation(h), 10, name="logits")
            return x, training, logits, cg.losses.sparse_softmax_cross_entropy(logits, y)

    x, training, logits, loss = model(cg.relu)
    job = cg.train(loss, (data.x_train, data.y_train), cluster=cluster, optimizer=cg.optim.Adam(1e-2), replicas=1,
                   batch_size=32, steps=20, checkpoint_every=None)  # fmt: skip
    try:
        job.wait(TIMEOUT)
        session = cg.Session(g)
        for name, value in job.variables().items():
            session.variables.load(g.node(name), value)
        batch = data.x_test[:50]
        inferred = session.run(logits, {x: batch, training: False})
        by_the_batch = session.run(logits, {x: batch})
        assert not np.allclose(inferred, by_the_batch)
        np.testing.assert_allclose(job.evaluate(logits, {x: batch}), inferred, rtol=1e-6)
        np.testing.assert_allclose(job.evaluate(logits, {x: batch, "training": True}), by_the_batch, rtol=1e-6)
        # The model's cell re-run as it was: the same computation, evaluated as before.
        x, _, logits, _ = model(cg.relu)
        np.testing.assert_allclose(job.evaluate(logits, {x: batch}), inferred, rtol=1e-6)
        # Re-run with another activation, the same shapes: the trained values would have run it without a word.
        x, _, logits, _ = model(cg.tanh)
        with pytest.raises(TrainingError) as changed:
            job.evaluate(logits, {x: batch})
        assert str(changed.value).startswith(
            f"{job.job_id}: cannot evaluate: the graph changed since the job started ("
        )
        assert (
            "re-made differently or gone, as by a re-run cell), and the job's trained values belong to the graph "
            "as it was. Evaluate before changing the model, or train the new graph: job.stop(), then cg.train(...) "
            "(or %train) again" in str(changed.value)
        )
    finally:
        job.close()


@pytest.mark.slow
def test_waiting_for_a_job_whose_cluster_closed_says_it_stopped(data: digits.Split) -> None:
    # Its cluster closed under it (a `with` block ended): job.wait() returns the stopped job, as job.events
    # tells it, not Dask's "IOLoop is closed" from the closed client.
    with Cluster.local(workers=2, ps=1) as own:
        job = start(own, data, checkpoint_every=5)
        wait_until(lambda: job.global_step() >= 12 and bool(job.checkpoints), "step 12 and a checkpoint", job)
    assert job.wait(TIMEOUT) is job and job.status == "stopped"
    assert any("closed while training, at global step" in e for e in job.events)
    # Its values are in its checkpoints now, and asking the servers says where.
    with pytest.raises(TrainingError) as gone:
        job.variables()
    assert str(gone.value).startswith(
        f"job {job.job_id} is closed: its parameter servers are gone; its last checkpoint is {job.checkpoints[-1]} "
        f"in {job.checkpoint_dir} (cg.save_model, cg.onnx.export and %export read values from that folder"
    )


@pytest.mark.slow
def test_a_job_closed_while_it_trains_is_stopped_not_finished(cluster: Cluster, data: digits.Split) -> None:
    # %cluster down and a closing cluster close their jobs the same way (job.close()).
    job = start(cluster, data, checkpoint_every=None)
    try:
        wait_until(lambda: job.global_step() >= 10, "step 10", job)
        reached = job.global_step()
    finally:
        job.close()
    assert job.status == "stopped"
    # The step it stopped at, not the supervisor's last look before (which the monitor had already passed).
    told = [e for e in job.events if "closed while training, at global step" in e]
    assert len(told) == 1 and told[0].endswith(": the job is stopped"), job.events
    assert int(told[0].split("at global step ")[1].split(":")[0]) >= reached, (reached, told)
    finished = start(cluster, data, steps=20, checkpoint_every=None)
    try:
        finished.wait(TIMEOUT)
    finally:
        finished.close()
    assert finished.status == "finished"  # a job that had ended stays as it ended
    assert not any("closed while training" in e for e in finished.events)


@pytest.mark.slow
def test_scale_adds_a_replica_then_removes_two_while_training(cluster: Cluster, data: digits.Split) -> None:
    steps = 2000
    job = start(cluster, data, steps=steps, checkpoint_every=None)
    try:
        wait_until(lambda: job.global_step() >= 20, "step 20", job)
        job.scale(3)
        assert job.replicas == 3 and len(job._state.futures) == 3
        # Three gradients make a step once the new replica has joined; then it trains like the others.
        wait_until(lambda: any("3 gradient(s) make a step from now on" in e for e in job.events), "k=3", job)
        wait_until(lambda: any(m["replica"] == 2 and m["steps"] > 0 for m in job.metrics), "replica 2's metrics", job)
        assert job.ps_stats()[0]["pushes_rejected"] == 0

        job.scale(1)  # replicas 1 and 2 leave after their step; one gradient makes a step
        assert job.replicas == 1
        assert all(job._state.futures[i].done() and job._state.futures[i].result()["stopped"] for i in (1, 2))
        events = "\n".join(job.events)
        assert "1 gradient(s) make a step from now on: replica(s) 1, 2 leave" in events
        assert "scaled to 1 replica(s): replica(s) 1, 2 leave after their step" in events
        job.wait(TIMEOUT)
        assert job.status == "finished" and job.global_step() == steps
        result = job._state.futures[0].result()
        assert not result["stopped"] and result["global_step"] == steps
        [shard] = job.ps_stats()
        assert shard["updates"] == steps and shard["pushes_rejected"] == 0
    finally:
        job.close()


@pytest.mark.slow
def test_scale_refuses_what_it_cannot_do_and_changes_nothing(cluster: Cluster, data: digits.Split) -> None:
    job = start(cluster, data)
    try:
        wait_until(lambda: job.global_step() >= 5, "step 5", job)
        before = (job.replicas, len(job._state.futures), job._state.training)
        with pytest.raises(TrainingError, match=r"job.scale\(4\): 4 replicas need 4 training workers and the cluster"):
            job.scale(4)
        with pytest.raises(TrainingError, match="job.scale needs a number of replicas of at least 1, got 0"):
            job.scale(0)
        assert (job.replicas, len(job._state.futures), job._state.training) == before
        job.stop(timeout=STOP_TIMEOUT)
        with pytest.raises(TrainingError, match=r"job job-\w+ is stopped: only a running job can be scaled"):
            job.scale(2)
    finally:
        job.close()


@pytest.mark.slow
def test_a_job_resumes_from_another_jobs_checkpoint(cluster: Cluster, data: digits.Split, tmp_path: object) -> None:
    first = start(cluster, data, steps=120, checkpoint_every=40, checkpoint_dir=tmp_path)
    try:
        first.wait(TIMEOUT)
        assert first.checkpoints[-1] == "ckpt-0000000120"
        trained = first.variables()
    finally:
        first.close()
    # From an earlier checkpoint than the folder's newest: the folder's run goes on from there (as TensorFlow's
    # Saver), and the job says that it writes over the newer one.
    second = start(
        cluster, data, steps=200, checkpoint_every=40, checkpoint_dir=tmp_path, resume_from="ckpt-0000000080"
    )
    try:
        assert second.global_step() >= 80  # it went on from the checkpoint, not from step 0
        events = "\n".join(second.events)
        assert "resumed from checkpoint ckpt-0000000080 at global step 80" in events
        assert (
            f"checkpoint_dir {tmp_path} also holds ckpt-0000000120, newer than ckpt-0000000080: this job writes its "
            "own checkpoints over those of the same steps"
        ) in events, events
        second.wait(TIMEOUT)
        assert second.status == "finished" and second.global_step() == 200
        [shard] = second.ps_stats()
        assert shard["updates"] == 120  # only the steps after the checkpoint were trained here
        assert set(second.variables()) == set(trained)
    finally:
        second.close()


@pytest.mark.slow
def test_dask_array_data_is_computed_on_the_workers_and_trains(cluster: Cluster, data: digits.Split) -> None:
    import operator

    import dask
    import dask.array as da

    # The data set is loaded by a task on the workers: this process never holds the training rows.
    loaded = dask.delayed(digits.load, pure=True)()
    rows, features = data.x_train.shape
    x = da.from_delayed(dask.delayed(operator.attrgetter("x_train"))(loaded), (rows, features), data.x_train.dtype)
    y = da.from_delayed(dask.delayed(operator.attrgetter("y_train"))(loaded), (rows,), data.y_train.dtype)
    x, y = x.rechunk((rows // 4, features)), y.rechunk(rows // 4)
    model = models.mlp()
    job = cg.train(
        model.loss, (x, y), cluster=cluster, optimizer=cg.optim.Adam(1e-2), replicas=2, batch_size=32, steps=300
    )
    try:
        # Each replica's shard is still a slice of the dask arrays: computed by the cluster for that replica's task.
        assert all(isinstance(part, da.Array) for shard in job._state.shards for part in shard)
        job.wait(TIMEOUT)
        assert job.status == "finished"
        logits = job.evaluate(model.logits, {model.x: data.x_test})
        assert float((logits.argmax(axis=1) == data.y_test).mean()) >= 0.9
    finally:
        job.close()


def test_a_dask_array_with_unknown_rows_is_refused_before_anything_starts(cluster: Cluster, data: digits.Split) -> None:
    import dask.array as da

    x = da.from_array(data.x_train, chunks=100)
    x = x[x[:, 0] >= 0]  # a boolean mask: the rows are unknown until computed
    model = models.mlp()
    plugins = cluster.client.run(lambda dask_worker: sorted(dask_worker.plugins))
    with pytest.raises(TrainingError, match="the dask array for placeholder 'x:0' has unknown chunk sizes: call "):
        cg.train(model.loss, (x, data.y_train), cluster=cluster, replicas=2)
    assert cluster.client.run(lambda dask_worker: sorted(dask_worker.plugins)) == plugins  # no PS was started
