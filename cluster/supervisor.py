"""A job's supervisor: starts it, then watches it on its own thread until it ends, and closes it.

The thread follows the global step and the servers' checkpoints, says in
``job.events`` which worker was lost or joined and what happens next
(``worker_watch``), submits lost replicas again (``replica_set``), restarts
lost parameter servers (``ps_recovery``), fails the job at once when a
replica fails on an error of its own (its traceback goes to the job's log
file, which the error names), and notices the end. Every event is written
by this thread, in the order things happened; Dask's callbacks only queue
what they heard.

It never dies of an exception: one while the job or its cluster is being
closed ends it quietly (the cluster's client is gone: nothing is left to
look at), and one while the job runs fails the job with that error.

Examples
--------
>>> AttributeError in CLOSE_ERRORS  # a bug in close() is raised, never taken for a closed cluster
False
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Sequence
from typing import Any

from cellgraph.dataflow.errors import CellgraphError

from .cluster import ClusterError, call_with_deadline
from .errors import ParameterServerError
from .job_spec import shard_rows
from .job_state import JobState, lost_with_worker
from .job_tasks import ps_variable, replicas_topic, worker_log_topic
from .placed_training import PlacedTraining, place_training
from .ps import ParameterClient
from .ps.sharding import layout_from_placement
from .ps_recovery import ServerRecovery, complete_checkpoints, publish_addresses
from .replica import ReplicaSpec, metrics_topic
from .replica_set import ReplicaSet
from .training_graph import TrainingError
from .worker_watch import WORKERS_POLL_S, WorkerWatch

# How often the supervisor looks at the parameter servers' step, to follow checkpoints and to notice the end.
WATCH_S = 0.2
# How long close() waits for the supervisor's thread to end; it is busy with at most one call, each with a deadline.
WATCHER_JOIN_S = 10.0
# How long close() lets the replicas end their step before it cancels their tasks.
STOP_GRACE_S = 5.0
# What close() lets pass while it ends the job: the cluster may be closing too (a Ctrl-C ends both), and each step
# must run whatever the one before did. Not AttributeError: a closed cluster is asked (`cluster.closed`), not
# guessed from a missing attribute.
CLOSE_ERRORS = (ClusterError, ParameterServerError, OSError, TimeoutError, RuntimeError)


def _gap_problem(used: list[int], ps_tasks: int) -> str | None:
    """Why the job cannot run on the ps tasks ``used`` (of ``ps_tasks``): a task before the last one used holds
    nothing. The job's servers are tasks 0 to n-1, each with a part of the model."""
    empty = [task for task in range(used[-1]) if task not in used] if used else []
    if not empty:
        return None
    return (
        f"the placement puts no variable on ps task(s) {', '.join(map(str, empty))} but some on ps task "
        f"{used[-1]} (of {ps_tasks}): a job's parameter servers are ps tasks 0 to n-1, each holding a part of the "
        "model; pin variables to /job:ps/task:0 first"
    )


class Supervisor:
    """Starts, watches and closes one job; ``Job`` is its handle."""

    def __init__(self, state: JobState) -> None:
        self.state = state
        self.watch = WorkerWatch(state)
        self.replicas = ReplicaSet(state, self.watch)
        self.recovery = ServerRecovery(state, self.watch)
        self.thread: threading.Thread | None = None
        self._skipped_seen: dict[int, int] = {}  # per shard: the steps_skipped already reported as an event
        self._written_seen = 0  # the checkpoints every shard had written at the last look
        self._checkpoint_errors: set[str] = set()
        self._worker_records: list[dict[str, str]] = []  # Dask's event thread appends; this thread writes them

    # ------------------------------------------------------------------ starting
    def place(self) -> PlacedTraining:
        """Place and partition the job's step (once): ``cg.train`` calls it before the start, so that a device
        scope the cluster cannot honour fails there."""
        state = self.state
        if state.placed is None:
            colocated = state.spec.ps_placement == "colocated"
            ps_tasks = state.spec.replicas if colocated else len(state.cluster.ps_workers())
            gpu = self._replica_gpu()
            placed = place_training(state.spec.graph, state.spec.optimizer, ps_tasks=ps_tasks, worker_gpu=gpu)
            layout = layout_from_placement(placed.placement, state.spec.graph.initial)
            used = sorted({shard for pieces in layout.values() for shard, _ in pieces})
            problem = state.training.layout_problem(len(used)) or _gap_problem(used, ps_tasks)
            if problem:
                raise TrainingError(f"cg.train: {problem}")
            state.placed, state.ps_shards = placed, len(used)
        return state.placed

    def _replica_gpu(self) -> bool:
        """Whether the replicas compute on their workers' GPUs (cg.train's ``gpu``): a replica may run on any
        training worker (a lost one's is replaced on another), so every one needs a GPU. The job's events say
        where they compute whenever a worker has a GPU."""
        state = self.state
        if state.spec.gpu is False:
            state.event("replicas compute on their workers' CPUs (gpu=False)")
            return False
        gpus = state.cluster.training_gpus()
        without = [address for address, count in gpus.items() if count < 1]
        if state.spec.gpu and without:
            raise TrainingError(
                f"cg.train(gpu=True): training worker(s) {', '.join(without)} have no GPU that numba.cuda sees; "
                "every training worker needs one (a replica may run on any of them): pass gpu=None to train on "
                "the CPUs there"
            )
        if gpus and not without:
            state.event("replicas compute on their workers' GPUs")
            return True
        if len(without) < len(gpus):
            state.event(
                f"replicas compute on their workers' CPUs: training worker(s) {', '.join(without)} have no GPU, "
                "and a replica may run on any training worker"
            )
        return False

    def start(self) -> None:
        """Start the servers, give them the job, submit one replica per shard, start watching."""
        import distributed

        state, spec = self.state, self.state.spec
        client = state.cluster.client
        placed = self.place()
        workers = state.cluster.training_workers()[: spec.replicas]
        # Colocated: shard i in replica i's worker.
        hosts = workers if spec.ps_placement == "colocated" else None
        # A server the placement gave nothing (a one-variable model on two ps tasks) is not part of the job: it
        # would never hear of it, and refuse every replica's Register.
        state.addresses = list(
            state.cluster.start_parameter_servers(state.job_id, state.token, state.checkpoint_dir, hosts=hosts)
        )[: state.ps_shards]
        try:
            state.ps = ParameterClient(state.addresses, state.token, timeout=spec.timeout_s)
            state.ps.init(
                state.job_id, spec.graph.initial, spec.optimizer, state.training,
                placement=placed.placement, moving=dict(zip(spec.graph.states, spec.graph.state_momenta)),
            )  # fmt: skip
            if spec.resume_from:
                step = state.step = state.ps.restore(spec.resume_from)
                state.restore_point, state.restore_step = spec.resume_from, step
                state.event(f"resumed from checkpoint {spec.resume_from} at global step {step}")
            publish_addresses(state)
            client.subscribe_topic(metrics_topic(state.job_id), self.on_metrics)
            client.subscribe_topic(replicas_topic(state.job_id), self.replicas.on_replica_start)
            client.subscribe_topic(worker_log_topic(state.job_id), self.on_worker_record)
            distributed.Event(state.stop_name, client=client).clear()
            for i, worker in enumerate(workers):
                rows = shard_rows(spec.rows, spec.replicas, i)
                state.shards.append([a[rows] for a in spec.arrays])
                state.specs.append(
                    ReplicaSpec(
                        state.job_id,
                        i,
                        placed.worker,
                        state.addresses,
                        state.token,
                        state.training.mode,
                        spec.batch_size,
                        spec.steps,
                        spec.seed + i,
                        spec.metrics_interval_s,
                        spec.timeout_s,
                        spec.overlap,
                    )  # fmt: skip
                )
                state.futures.append(self.replicas.submit(i, worker))
        except BaseException:
            self.close()
            raise
        state.event(
            f"started {spec.replicas} replica(s) in {state.training.mode} mode on {', '.join(workers)}; "
            f"PS at {', '.join(state.addresses)}" + (" (a shard in each replica's worker)" if hosts is not None else "")
        )
        self.watch.look()
        self.thread = threading.Thread(target=self._run, name=f"cellgraph-{state.job_id}-watch", daemon=True)
        self.thread.start()

    def on_metrics(self, event: tuple[float, dict[str, Any]]) -> None:
        """Dask's callback for a replica's metrics message."""
        _, message = event
        with self.state.lock:
            self.state.metrics.append(dict(message))

    def on_worker_record(self, event: tuple[float, dict[str, str]]) -> None:
        """Dask's callback for a worker's log record about one of the job's replica tasks (``RouteJobRecords``)."""
        _, record = event
        with self.state.lock:
            self._worker_records.append(dict(record))

    def _note_worker_records(self) -> None:
        """Write the workers' records about the job's tasks to the job's log file, a line each in its events."""
        state = self.state
        with state.lock:
            records, self._worker_records = self._worker_records, []
        for r in records:
            self._log(f"worker {r.get('worker')} {r.get('level')} {r.get('logger')}: {r.get('text')}")
            first = str(r.get("text", "")).splitlines()[0] if r.get("text") else ""
            state.event(
                f"worker {r.get('worker')} logged {r.get('level')} ({r.get('logger')}): {first[:300]}; "
                f"the whole record is in {state.log_path}"
            )

    # ------------------------------------------------------------------ watching
    def _run(self) -> None:
        state = self.state
        try:
            self._watch()
        except Exception as err:  # noqa: BLE001 - a supervisor never dies of one: see the module's docstring
            if state.closed.is_set() or state.cluster.closed:
                return
            state.error = TrainingError(f"job {state.job_id}: its supervisor failed: {type(err).__name__}: {err}")
            state.event(str(state.error))
            with contextlib.suppress(Exception):
                state.signal_stop()

    def _watch(self) -> None:
        """Follow the step and the checkpoints; replace what was lost; notice the end."""
        state = self.state
        next_look = time.monotonic() + WORKERS_POLL_S
        while not state.closed.is_set():
            if state.cluster.closed:
                return  # closed under the job: its tasks and servers went with it
            if time.monotonic() >= next_look:
                self.watch.look()
                next_look = time.monotonic() + WORKERS_POLL_S
            self.replicas.note_starts()
            self._note_worker_records()
            if not state.stopping and state.error is None:
                if not self._note_failures() or not self.replicas.replace_lost():
                    continue  # the job has failed: the loop goes on until the other replicas have ended
            done = state.ended()
            try:
                self._read_step()
            except ParameterServerError as err:
                if done:
                    self._finish()
                    return
                if err.code != "UNAVAILABLE":
                    state.event(f"could not read the global step: {err}; the job goes on and asks again")
                elif state.error is None and not self.recovery.restart(err):
                    continue
                time.sleep(WATCH_S)
                continue
            except CellgraphError as err:
                state.event(f"could not read the global step: {err}; the job goes on and asks again")
            if done:
                self._finish()
                return
            state.closed.wait(WATCH_S)

    def _note_failures(self) -> bool:
        """Fail the job at once when a replica failed on an error of its own; False if one did."""
        state = self.state
        for i, future in enumerate(state.futures):
            failure = state.failure(i)
            if failure is not None:
                where, error, trace = (
                    f" on {failure.worker}",
                    f"{failure.error_type}: {failure.error}",
                    failure.traceback,
                )
            elif future.status == "error" and not lost_with_worker(future):
                exc = future.exception()
                where, error, trace = "", f"{type(exc).__name__}: {exc}", repr(exc)
            else:
                continue
            self._log(f"replica {i} of job {state.job_id} failed{where}:\n{trace}")
            state.error = TrainingError(
                f"replica {i} of job {state.job_id} failed{where}: {error}. The job has failed at once (the same "
                f"error would come back wherever it ran); the replica's traceback is in {state.log_path}"
            )
            state.event(str(state.error))
            state.signal_stop()
            # The others finish their step: in sync mode one gradient makes it, so none waits for this replica's.
            state.set_replicas_to_aggregate(1, f"replica {i} failed")
            return False
        return True

    def _log(self, text: str) -> None:
        with open(self.state.log_path, "a", encoding="utf-8") as log:
            log.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n")

    def _read_step(self) -> int:
        """The global step, how fast it moves (steps per second, smoothed), and the servers' checkpoints."""
        state = self.state
        if state.ps is None:
            raise TrainingError(f"job {state.job_id} has no parameter servers")
        stats = state.ps.stats()
        step, now = min(s.global_step for s in stats), time.monotonic()
        if step > state.step and now > state.step_time:
            rate = (step - state.step) / (now - state.step_time)
            state.step_rate = rate if state.step_rate == 0 else 0.5 * (state.step_rate + rate)
        state.step, state.step_time = step, now
        self._note_checkpoints(stats)
        self._note_skipped_steps(stats)
        self.replicas.apply_pending_k(stats)
        return step

    def _note_skipped_steps(self, stats: Sequence[Any]) -> None:
        """Say when a shard dropped an update for a NaN or Inf gradient (``nonfinite="skip_step"``)."""
        for shard, s in enumerate(stats):
            seen = self._skipped_seen.get(shard, 0)
            if s.steps_skipped > seen:
                self._skipped_seen[shard] = s.steps_skipped
                self.state.event(
                    f"parameter server {shard} skipped {s.steps_skipped - seen} update(s) for a non-finite gradient "
                    f"({s.steps_skipped} in all; last: {s.last_skipped}); nonfinite='skip_step' keeps training"
                )

    def _note_checkpoints(self, stats: Sequence[Any]) -> None:
        """Record the newest checkpoint every shard has written (the restore point), and say why one failed."""
        state = self.state
        written = [(s.latest_checkpoint_step, s.latest_checkpoint) for s in stats]
        if all(name for _, name in written):
            step, name = min(written)  # the shards keep their last few: the oldest newest one is on all of them
            if step > state.restore_step:
                state.restore_point, state.restore_step = name, step
                self._add_checkpoint(name)
                # Each look sees only the newest: a fast job writes several between two looks, so say how many.
                count = min(s.checkpoints_written for s in stats)
                since = f"; {count - self._written_seen} since the last look" if count - self._written_seen > 1 else ""
                self._written_seen = count  # a restarted server counts from 0 again
                state.event(
                    f"checkpoint {name} written (every {state.spec.checkpoint_every} steps{since}) in "
                    f"{state.checkpoint_dir}"
                )
        for s in stats:
            if s.checkpoint_error and s.checkpoint_error not in self._checkpoint_errors:
                self._checkpoint_errors.add(s.checkpoint_error)
                state.event(
                    f"parameter server shard {s.shard}: {s.checkpoint_error}; the job goes on, and a lost server "
                    f"would restart from {state.restore_point or 'the initial values'}"
                )

    def _add_checkpoint(self, name: str) -> None:
        """Refresh ``job.checkpoints`` after the servers wrote ``name``: the checkpoints complete on every shard in
        the folder (the servers' retention deletes old ones), oldest first; where this process cannot read the
        folder (it lives on the PS machines only), the names the servers reported."""
        state = self.state
        existing = complete_checkpoints(state)
        with state.lock:
            if existing is not None:
                state.checkpoints[:] = existing
            elif name not in state.checkpoints:
                state.checkpoints.append(name)

    def _finish(self) -> None:
        state = self.state
        self._note_worker_records()
        if state.error is None:
            self._note_failures()
        if state.error is None:
            failed = [f for f in state.futures if f.status in ("error", "cancelled")]
            if failed:
                state.error = (
                    failed[0].exception() if failed[0].status == "error" else TrainingError("its task was cancelled")
                )
                state.event(f"replica {state.futures.index(failed[0])} failed: {state.error}")
        if state.error is not None:
            return
        self.save("final")
        state.event(f"{'stopped' if state.stopping else 'finished'} at global step {state.step}")

    def save(self, why: str) -> bool:
        """Checkpoint every shard; whether it worked (a failure is an event, and the next look tries again)."""
        state = self.state
        if state.ps is None:
            return False
        try:
            name = state.ps.save()
            state.step = state.global_step()
        except CellgraphError as err:
            state.event(f"checkpoint ({why}) failed: {err}")
            return False
        if "," not in name:  # shards at different steps save under different names: no restore point then
            state.restore_point, state.restore_step = name, max(state.restore_step, state.step)
        self._add_checkpoint(name)
        state.event(f"checkpoint {name} written ({why}) in {state.checkpoint_dir}")
        return True

    # ------------------------------------------------------------------ closing
    def close(self) -> None:
        """End the job in order: replicas told to stop, the supervisor's thread ended, tasks cancelled, servers
        stopped. Each step has a deadline, and one that fails does not keep the next from running."""
        state = self.state
        if state.closed.is_set():
            return
        state.closed.set()
        cluster = state.cluster
        client, name = cluster.client, ps_variable(state.job_id)
        live = not cluster.closed  # a closed cluster took the tasks and the servers with it
        if live and not all(f.done() for f in state.futures):
            self._let_replicas_end()
        # The thread ends at its next look; waited for (not forever) so that it cannot take the cancelled tasks
        # below for lost ones and submit them again.
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(timeout=WATCHER_JOIN_S)
        if live:
            with contextlib.suppress(*CLOSE_ERRORS):
                # Only those still running: cancelling a finished task would turn its future's status to cancelled.
                running = [f for f in state.futures if not f.done()]
                call_with_deadline(lambda: client.cancel(running), f"cancel job {state.job_id}'s replicas")
            # A finished replica's result (a few numbers, already read) is pinned on its worker while its future is
            # held; should that worker go later, Dask would run the replica again to get it back.
            for i in range(len(state.futures)):
                state.failure(i)  # kept for job.wait() and job.status
                state.futures[i].release()
            for topic in (metrics_topic(state.job_id), replicas_topic(state.job_id), worker_log_topic(state.job_id)):
                with contextlib.suppress(*CLOSE_ERRORS, ValueError):
                    client.unsubscribe_topic(topic)
        with contextlib.suppress(*CLOSE_ERRORS):
            if state.ps is not None:
                state.ps.close()
        if live:
            with contextlib.suppress(*CLOSE_ERRORS):
                if state.addresses:
                    call_with_deadline(
                        lambda: distributed_variable(name, client).delete(), f"delete the Dask variable {name}"
                    )
            with contextlib.suppress(*CLOSE_ERRORS):
                cluster.stop_parameter_servers(state.job_id)
        state.ps = None

    def _let_replicas_end(self) -> None:
        """Tell the replicas to stop and give them ``STOP_GRACE_S`` to end their step: a task cancelled while it
        runs makes its worker log a warning (into the user's cells), and one cut off with its worker, a kill."""
        state = self.state
        with contextlib.suppress(*CLOSE_ERRORS):
            call_with_deadline(state.signal_stop, f"tell job {state.job_id}'s replicas to stop")
        with contextlib.suppress(*CLOSE_ERRORS):
            # A sync replica that has pushed waits for the others' gradients: one makes a step from now on.
            call_with_deadline(
                lambda: state.set_replicas_to_aggregate(1, "the job is closing"), f"reconfigure job {state.job_id}"
            )
        deadline = time.monotonic() + STOP_GRACE_S
        while not all(f.done() for f in state.futures) and time.monotonic() < deadline:
            time.sleep(0.05)


def distributed_variable(name: str, client: Any) -> Any:
    import distributed

    return distributed.Variable(name, client=client)


__all__ = ["CLOSE_ERRORS", "WATCHER_JOIN_S", "WATCH_S", "Supervisor"]
