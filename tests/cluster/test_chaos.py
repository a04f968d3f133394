"""Faults in combinations and at moments the other fault tests leave out: real processes, nothing mocked but the
nanny's pace (a PS worker that Dask restarts only later)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from cellgraph.cluster import step_watch, supervisor
from cellgraph.cluster.cluster import Cluster
from cellgraph.cluster.job import Job
from cellgraph.cluster.ps_plugin import plugin_name
from cellgraph.cluster.training_graph import TrainingError
from cellgraph.examples import digits
from cellgraph.widgets import TrainingMonitor

from .test_faults import TIMEOUT, event_index, kill_worker, local_cluster, start_job, wait_for_event, wait_for_step

__all__ = ["local_cluster"]  # the fixture, used by name


def wait_for_nth_event(job: Job, words: str, n: int) -> str:
    """Event ``n`` (from 0) of those in ``job.events`` that contain ``words``, once there is one (within ``TIMEOUT``)."""
    deadline = time.monotonic() + TIMEOUT
    while len(found := [e for e in job.events if words in e]) <= n:
        assert time.monotonic() < deadline, f"no event {n} with {words!r}: {job.events}"
        assert job.status == "running", job.events
        time.sleep(0.05)
    return found[n]


def restart_later(cluster: Cluster, name: str, delay: float) -> None:
    """Make the nanny of worker ``name`` start a new worker process ``delay`` s after the old one died."""
    nanny: Any = cluster._local_cluster.workers[name]  # type: ignore[union-attr]
    instantiate = nanny.instantiate

    async def later() -> Any:
        await asyncio.sleep(delay)
        return await instantiate()

    nanny.instantiate = later


@pytest.mark.slow
def test_a_job_closed_while_its_lost_server_restarts_stays_stopped_and_leaves_nothing_running(
    local_cluster: Callable[..., Cluster], data: digits.Split
) -> None:
    cluster = local_cluster(workers=2, ps=1)
    [ps_worker] = cluster.ps_workers()
    # The job waits up to timeout_s for the PS worker to come back; it comes back later than the close.
    job = start_job(cluster, data, replicas=2, aggregate=None, checkpoint_every=20, timeout_s=TIMEOUT)
    wait_for_step(job, 30)
    restart_later(cluster, "ps-0", TIMEOUT)
    kill_worker(cluster, ps_worker)
    wait_for_event(job, "did not answer")
    job.close()
    # close() ended the supervisor's wait for the new server: nothing of the job goes on after it.
    thread = job._supervisor.thread
    assert thread is not None and not thread.is_alive(), job.events
    assert job.status == "stopped", job.events
    assert job._state.ps is None and job._state.error is None
    events = "\n".join(job.events)
    assert (
        f"the job was closed while its parameter server(s) {job._state.addresses[0]} restarted: they are not "
        "restarted, and the job stays stopped" in events
    ), events
    assert "could not be restarted" not in events
    assert job.events[-1].endswith("the job is stopped"), job.events


@pytest.mark.slow
def test_a_server_lost_twice_names_each_lost_worker_in_the_order_things_happened(
    local_cluster: Callable[..., Cluster], data: digits.Split
) -> None:
    cluster = local_cluster(workers=2, ps=1)
    [first] = cluster.ps_workers()
    job = start_job(cluster, data, replicas=2, aggregate=None, steps=400, checkpoint_every=20)
    try:
        wait_for_step(job, 30)
        kill_worker(cluster, first)
        wait_for_event(job, "restarted at")
        [second] = cluster.ps_workers()  # the nanny's new worker, which the restarted server runs in
        assert second != first
        kill_worker(cluster, second)
        job.wait(TIMEOUT)
        assert job.status == "finished" and job.global_step() == 400, job.events
        silent = [n for n, e in enumerate(job.events) if "did not answer (last seen" in e]
        restarted = [n for n, e in enumerate(job.events) if "restarted at" in e]
        assert len(silent) == len(restarted) == 2, job.events
        # Each silent server is said to be in the worker that was lost with it, not the first one lost.
        for n, worker in zip(silent, (first, second), strict=True):
            assert "name ps-0, role ps, task 0)" in job.events[n] and f"; worker {worker}, " in job.events[n], (
                job.events
            )
        # Each worker was lost before its server restarted, and its replacement joined before that too.
        for worker, done in zip((first, second), restarted, strict=True):
            assert event_index(job, f"lost worker {worker}") < done, job.events
        joined = [n for n, e in enumerate(job.events) if "joined (name ps-0, role ps, task 0)" in e]
        assert len(joined) == 2 and all(j < r for j, r in zip(joined, restarted, strict=True)), job.events
    finally:
        job.close()


@pytest.mark.slow
def test_a_hung_worker_that_holds_up_a_sync_step_is_named_and_the_job_goes_on_once_it_wakes(
    local_cluster: Callable[..., Cluster], data: digits.Split, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(step_watch, "STALL_S", 2.0)
    cluster = local_cluster(workers=2, ps=1)
    victim = cluster.training_workers()[1]  # replica 1 runs there
    job = start_job(cluster, data, replicas=2, aggregate=2, steps=200)
    pid = cluster.client.run(os.getpid, workers=[victim])[victim]
    try:
        wait_for_step(job, 20)
        os.kill(pid, signal.SIGSTOP)  # hung, not lost: Dask keeps the worker, the job has nothing to replace
        try:
            stalled = wait_for_event(job, "the global step has stayed at")
        finally:
            os.kill(pid, signal.SIGCONT)
        # The replica holding the step up comes first; the other one waits for its gradient.
        assert re.search(
            r"the global step has stayed at \d+ for \d+ s: replica 1 last heard from [\d.]+ s ago, replica 0 last "
            r"heard from [\d.]+ s ago; in sync mode a step waits for 2 gradient\(s\), so a stopped or hung worker "
            r"holds the job up \(a lost one is replaced\); each replica's calls give up after timeout_s=60 s",
            stalled,
        ), stalled
        job.wait(TIMEOUT)
        assert job.status == "finished" and job.global_step() == 200, job.events
        assert event_index(job, "the global step has stayed at") < event_index(job, "the global step moves again")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        job.close()


@pytest.mark.slow
def test_a_job_scaled_down_while_its_server_restarts_trains_on_with_the_fewer_gradients_a_step(
    local_cluster: Callable[..., Cluster], data: digits.Split
) -> None:
    cluster = local_cluster(workers=2, ps=1)
    [ps_worker] = cluster.ps_workers()
    job = start_job(cluster, data, replicas=2, aggregate=2, checkpoint_every=20)
    try:
        wait_for_step(job, 30)
        restart_later(cluster, "ps-0", 3.0)  # the scale below finds the server gone
        kill_worker(cluster, ps_worker)
        job.scale(1, timeout=TIMEOUT)  # one replica is left: one gradient makes a step, on the restarted server too
        restarted = wait_for_event(job, "restarted at")
        at = int(re.findall(r"at global step (\d+)", restarted)[-1])
        wait_for_step(job, at + 20)  # the step waited for a second gradient that never came, until replica 0 gave up
        job.stop(TIMEOUT)
        assert job.status == "stopped", job.events
        events = "\n".join(job.events)
        assert (
            "could not make steps of 1 gradient(s) (replica(s) 1 leave) now: parameter server " in events
            and "the job tells the parameter servers again until they answer (a restarted one starts with it)" in events
        ), events
        [stats] = job._state.ps.stats()  # type: ignore[union-attr]
        assert stats.updates == stats.pushes_applied  # one gradient a step
    finally:
        job.close()


@pytest.mark.slow
def test_a_hung_backup_worker_is_named_as_what_the_end_of_the_job_waits_for(
    local_cluster: Callable[..., Cluster], data: digits.Split, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(step_watch, "STALL_S", 2.0)
    cluster = local_cluster(workers=3, ps=1)
    victim = cluster.training_workers()[1]  # replica 1 runs there
    job = start_job(cluster, data, replicas=3, aggregate=2, steps=150)  # a backup: the others make every step
    pid = cluster.client.run(os.getpid, workers=[victim])[victim]
    try:
        wait_for_step(job, 20)
        os.kill(pid, signal.SIGSTOP)
        try:
            waits = wait_for_event(job, "reached its last step")
        finally:
            os.kill(pid, signal.SIGCONT)
        assert re.search(
            r"the job reached its last step \(150\) \d+ s ago and waits for its replicas to end: replica 1 last heard "
            r"from [\d.]+ s ago; a stopped or hung worker holds the job's end up \(a lost one is replaced\), until "
            r"timeout_s=60 s after the last step: then the job abandons it",
            waits,
        ), waits
        job.wait(TIMEOUT)
        assert job.status == "finished" and job.global_step() == 150, job.events
        assert not [e for e in job.events if "the global step has stayed at" in e], job.events  # no step waited
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        job.close()


@pytest.mark.slow
def test_a_training_worker_gone_before_its_replica_is_sent_does_not_fail_the_start(
    local_cluster: Callable[..., Cluster], data: digits.Split, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = local_cluster(workers=2, ps=1, threads_per_worker=2)  # two replicas fit on one worker
    first, _ = cluster.training_workers()
    # What the job's start sees when worker 1 is killed between choosing it and sending it its shard: an address the
    # scheduler no longer knows (the chaos run killed it there: the start failed with "KeyError: 'tcp://...'").
    gone = "tcp://127.0.0.1:9"
    monkeypatch.setattr(cluster, "training_workers", lambda: [first, gone])
    job = start_job(cluster, data, replicas=2, aggregate=2, steps=50)
    try:
        job.wait(TIMEOUT)
        assert job.status == "finished" and job.global_step() == 50, job.events
        event = wait_for_event(job, "was lost before its shard reached it")
        assert (
            f"replica 1's training worker {gone} was lost before its shard reached it: it runs on another "
            "training worker" in event
        )
    finally:
        job.close()


@pytest.mark.slow
def test_a_training_worker_killed_while_the_servers_start_does_not_fail_the_start(
    local_cluster: Callable[..., Cluster], data: digits.Split
) -> None:
    cluster = local_cluster(workers=2, ps=1, threads_per_worker=2)  # two replicas fit on one worker
    victim = cluster.training_workers()[1]
    pid = cluster.client.run(os.getpid, workers=[victim])[victim]
    os.kill(pid, signal.SIGSTOP)  # Dask's broadcast of the servers' plugin waits on it...
    job = start_job(cluster, data, replicas=2, aggregate=2, steps=50)
    try:
        plugin = plugin_name(job.job_id)
        deadline = time.monotonic() + TIMEOUT
        while plugin not in cluster.client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.worker_plugins)):
            assert time.monotonic() < deadline, f"the servers' plugin was not registered within {TIMEOUT} s"
            time.sleep(0.05)
        time.sleep(0.5)  # the broadcast under way
        os.kill(pid, signal.SIGKILL)  # ...and loses it (the chaos run killed a worker during the start there)
        # Before: "job J could not start: could not start the parameter servers of job 'J' on tcp://...: in <TCP
        # (closed) ConnectionPool.register_worker_plugin ...>: Stream is closed", for a training worker's loss.
        job.wait(TIMEOUT)
        assert job.status == "finished" and job.global_step() == 50, job.events
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        job.close()


@pytest.mark.slow
def test_a_ps_worker_killed_while_its_server_starts_fails_the_start_at_once_naming_it(
    local_cluster: Callable[..., Cluster], data: digits.Split
) -> None:
    cluster = local_cluster(workers=2, ps=1)
    [ps_worker] = cluster.ps_workers()
    pid = cluster.client.run(os.getpid, workers=[ps_worker])[ps_worker]
    os.kill(pid, signal.SIGSTOP)  # Dask's broadcast of the servers' plugin waits on it...
    job = start_job(cluster, data, replicas=2, aggregate=None, steps=50)
    try:
        plugin = plugin_name(job.job_id)
        deadline = time.monotonic() + TIMEOUT
        while plugin not in cluster.client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.worker_plugins)):
            assert time.monotonic() < deadline, f"the servers' plugin was not registered within {TIMEOUT} s"
            time.sleep(0.05)
        time.sleep(0.5)  # the broadcast under way
        os.kill(pid, signal.SIGKILL)  # ...and loses it
        # Not 'find job J's servers on workers ...: no answer within 30 s; is a worker stuck ... or gone?' 30 s on.
        with pytest.raises(TrainingError) as info:
            job.wait(TIMEOUT)
        assert str(info.value) == (
            f"job {job.job_id} could not start: could not start the parameter servers of job '{job.job_id}' on "
            f"{ps_worker}: PS worker(s) {ps_worker} left the cluster while the servers started (a killed worker is "
            "started again by its nanny): cg.train(...) again once it is back"
        )
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        job.close()


@pytest.mark.slow
def test_a_ps_worker_hung_for_good_fails_the_job_within_twice_its_timeout_saying_the_worker_is_stuck(
    local_cluster: Callable[..., Cluster], data: digits.Split
) -> None:
    cluster = local_cluster(workers=2, ps=1)
    [ps_worker] = cluster.ps_workers()
    pid = cluster.client.run(os.getpid, workers=[ps_worker])[ps_worker]
    timeout_s = 5.0
    job = start_job(cluster, data, replicas=2, aggregate=None, checkpoint_every=10, timeout_s=timeout_s)
    try:
        wait_for_step(job, 20)
        os.kill(pid, signal.SIGSTOP)  # for good: Dask does not count it lost for minutes (its worker TTL)
        stopped = time.monotonic()
        with pytest.raises(TrainingError) as info:
            job.wait(TIMEOUT)
        # Before: 4-5 times timeout_s (the supervisor asked Stats again and again, timeout_s each time, and the job
        # failed only when a replica gave up: its first call, then rejoins of timeout_s each for 2 x timeout_s).
        assert time.monotonic() - stopped < 3 * timeout_s, job.events
        said = str(info.value)
        address = job._state.addresses[0]
        assert said.startswith(
            f"job {job.job_id}: its parameter server(s) {address} were lost and could not be restarted: "
        ), said
        assert (
            f" PS worker(s) {ps_worker} are still in the cluster, and their server gave no answer: a worker stopped "
            "(SIGSTOP), hung or cut off from the network, which Dask does not restart. The job has failed: "
            "job.close() ends it, and cg.train(..., resume_from='ckpt-"
        ) in said, said
        silent = wait_for_event(job, "did not answer (last seen")
        assert f"gave no answer to Stats within the {timeout_s:g} s deadline. The job waits up to " in silent, silent
        assert f"a lost server fails the job within 2 x timeout_s={timeout_s:g} s of that)" in silent, silent
        # A failed job's reads answer from what it knew, at once: before, each waited timeout_s for the stopped
        # server (a call's deadline), so none could answer within it.
        asked = time.monotonic()
        assert job.global_step() >= 20
        with pytest.raises(TrainingError) as stats:
            job.ps_stats()
        assert time.monotonic() - asked < timeout_s
        assert str(stats.value).startswith(
            f"{said}. job.ps_stats() has nothing to read: the job's parameter servers are gone with it; its last "
            f"checkpoint is ckpt-"
        ), str(stats.value)
        # Nor does its close wait on the stopped worker: before, 30 s (the deadline of taking the servers' plugin off
        # the workers, CALL_TIMEOUT_S), whatever timeout_s.
        closing = time.monotonic()
        job.close()
        assert time.monotonic() - closing < 3 * timeout_s
        assert job.status == "failed" and job._state.ps is None
    finally:
        os.kill(pid, signal.SIGCONT)
        job.close()


@pytest.mark.slow
def test_a_server_lost_after_the_last_step_before_the_final_checkpoint_fails_the_job_saying_so(
    local_cluster: Callable[..., Cluster], data: digits.Split, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The final checkpoint waits until the server is killed: under load the supervisor could otherwise notice the
    # end and save before the test killed it (a CI run saw the job finish). The real save then runs, and fails.
    killed = threading.Event()
    save = step_watch.StepWatch.save

    def final_after_the_kill(self: step_watch.StepWatch, why: str) -> bool:
        if why == "final":
            assert killed.wait(TIMEOUT), "the test did not kill the server"
        return save(self, why)

    monkeypatch.setattr(step_watch.StepWatch, "save", final_after_the_kill)
    cluster = local_cluster(workers=2, ps=1)
    [ps_worker] = cluster.ps_workers()
    pid = cluster.client.run(os.getpid, workers=[ps_worker])[ps_worker]
    job = start_job(cluster, data, replicas=2, aggregate=None, checkpoint_every=20, steps=70, timeout_s=5.0)
    try:
        deadline = time.monotonic() + TIMEOUT
        while not (job._state.futures and job._state.ended()):  # the replicas have ended; the final checkpoint waits
            assert time.monotonic() < deadline and job.status in ("starting", "running"), job.events
            time.sleep(0.005)
        # Running until the final checkpoint is written: before, 'finished' here and 'failed' after the kill.
        assert job.status == "running", job.events
        os.kill(pid, signal.SIGKILL)
        killed.set()
        # Before: 'finished at global step 62' (the job's last look) and job.variables() raised the lost server's
        # raw ParameterServerError: the values of the steps since the last checkpoint were gone without a word.
        with pytest.raises(TrainingError) as info:
            job.wait(TIMEOUT)
        said = str(info.value)
        assert said.startswith(
            f"job {job.job_id} has failed: its replicas had ended, then its parameter server(s) did not answer the "
            "final checkpoint or since: parameter server "
        ), said
        assert said.endswith(
            "The values trained since ckpt-0000000060 (global step 60) went with them; "
            "cg.train(..., resume_from='ckpt-0000000060') trains those steps again"
        ), said
        assert job.status == "failed"
        with pytest.raises(TrainingError) as asked:
            job.variables()
        assert str(asked.value).startswith(said), str(asked.value)
    finally:
        job.close()


@pytest.mark.slow
def test_global_step_while_a_server_restarts_is_the_step_last_read_not_its_error(
    local_cluster: Callable[..., Cluster], data: digits.Split
) -> None:
    cluster = local_cluster(workers=2, ps=1)
    [ps_worker] = cluster.ps_workers()
    job = start_job(cluster, data, replicas=2, aggregate=None, checkpoint_every=20, timeout_s=TIMEOUT)
    try:
        wait_for_step(job, 30)
        before = job.global_step()
        restart_later(cluster, "ps-0", 5.0)  # the server is away a while: the question comes while it restarts
        kill_worker(cluster, ps_worker)
        wait_for_event(job, "did not answer")
        assert job._state.recovering, job.events  # the job waits for the restart now
        # Before: ParameterServerError 'parameter server ... did not answer Stats after 5 attempt(s) within ...'.
        assert job.global_step() >= before
        # ps_stats() and variables() have nothing to read meanwhile: the job's words, not the server's raw error.
        for ask, what in ((job.ps_stats, "job.ps_stats()"), (job.variables, "job.variables()")):
            with pytest.raises(TrainingError) as asked:
                ask()
            assert str(asked.value) == (
                f"{what}: a parameter server of job {job.job_id} is restarting (job.events says which); ask again "
                f"once it is back, within timeout_s={TIMEOUT:g} s"
            )
        restarted = wait_for_event(job, "restarted at")
        restored = int(re.findall(r"at global step (\d+)", restarted)[-1])
        assert job.global_step() >= restored  # the restored server's step, once it answers
    finally:
        job.close()


@pytest.mark.slow
def test_the_steps_lost_count_from_the_step_the_servers_reached_not_the_jobs_last_look(
    local_cluster: Callable[..., Cluster], data: digits.Split, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The job looks at its servers seldom: its last look lags the servers by many steps when one is lost.
    monkeypatch.setattr(supervisor, "WATCH_S", 3.0)
    cluster = local_cluster(workers=2, ps=1)
    job = start_job(cluster, data, replicas=2, aggregate=None, checkpoint_every=20, timeout_s=TIMEOUT)
    try:
        for _ in range(2):  # the second loss counts from its own servers' steps, not from the first one's
            [ps_worker] = cluster.ps_workers()
            wait_for_step(job, job.global_step() + 30)
            reached = job.global_step()
            kill_worker(cluster, ps_worker)
            restarted = wait_for_nth_event(job, "restarted at", len([e for e in job.events if "restarted at" in e]))
            found = re.search(r"restored (\S+) at global step (\d+): (\d+) step\(s\) lost", restarted)
            assert found, restarted
            restored, lost = int(found[2]), int(found[3])
            # Before: counted from the job's last look before the loss, up to WATCH_S of training behind (and the
            # second loss, from that look or the first servers' metrics: '1 step(s) lost' of 42 in a run).
            assert lost >= reached - restored, (reached, restarted)
    finally:
        job.close()


@pytest.mark.slow
def test_a_backup_worker_hung_for_good_is_abandoned_and_the_job_finishes_without_it(
    local_cluster: Callable[..., Cluster], data: digits.Split
) -> None:
    cluster = local_cluster(workers=3, ps=1)
    victim = cluster.training_workers()[1]  # replica 1 runs there
    # A backup: the others make every step. timeout_s: how long the job gives a replica to end after the last step.
    job = start_job(cluster, data, replicas=3, aggregate=2, steps=150, timeout_s=10.0)
    pid = cluster.client.run(os.getpid, workers=[victim])[victim]
    try:
        wait_for_step(job, 20)
        os.kill(pid, signal.SIGSTOP)  # hung until the test's end
        # Before: 'running' for as long as the worker stayed stopped (the wait below ran out).
        job.wait(TIMEOUT)
        assert job.status == "finished" and job.global_step() == 150, job.events
        assert job.abandoned == [1]
        monitor = TrainingMonitor(job)  # the widget says so too, not a replica that ended as the others
        try:
            assert "replica 1 abandoned (hung after the last step: its task cancelled)" in monitor.title.value
        finally:
            monitor.close()
        abandoned = wait_for_event(job, "did not end within")
        assert abandoned.endswith(
            f"the job reached its last step (150) and replica 1 on {victim} (name worker-1, role worker, task 1) "
            "did not end within timeout_s=10 s: a stopped or hung worker; the job abandons it (its task cancelled) "
            "and ends without it"
        ), abandoned
        assert event_index(job, "did not end within") < event_index(job, "finished at global step 150")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        job.close()
