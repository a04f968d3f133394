"""A job's supervisor: starts it, then watches it on its own thread until it ends, and closes it.

The thread follows the global step and the servers' checkpoints
(``step_watch``), says in ``job.events`` which worker was lost or joined
and what happens next (``worker_watch``), submits lost replicas again
(``replica_set``), restarts lost parameter servers (``ps_recovery``), fails
the job at once when a replica fails on an error of its own (its traceback
goes to the job's log file, which the error names), and notices the end.
Every event is written by this thread, in the order things happened; Dask's
callbacks only queue what they heard.

It never dies of an exception: one while the job or its cluster is being
closed ends it quietly (the cluster's client is gone: nothing is left to
look at), and one while the job runs fails the job with that error.
Closing ends the job's parts in order (``job_close``).

Examples
--------
>>> AttributeError in CLOSE_ERRORS  # a bug in close() is raised, never taken for a closed cluster
False
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

from cellgraph.dataflow.errors import CellgraphError

from .errors import ParameterServerError
from .job_close import CLOSE_ERRORS, WATCHER_JOIN_S, close_job
from .job_spec import held_checkpoints, no_training_worker, shard_rows
from .job_state import JobState, lost_with_worker
from .job_tasks import replicas_topic, worker_log_topic
from .placed_training import PlacedTraining, place_training
from .ps import ParameterClient
from .ps.sharding import layout_from_placement
from .ps_recovery import ServerRecovery, publish_addresses
from .replica import ReplicaSpec, metrics_topic
from .replica_set import ReplicaSet
from .step_watch import StepWatch
from .training_graph import TrainingError
from .worker_watch import WORKERS_POLL_S, WorkerWatch

# How often the supervisor looks at the parameter servers' step, to follow checkpoints and to notice the end.
WATCH_S = 0.2


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
        self.steps = StepWatch(state)
        self.thread: threading.Thread | None = None
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
        workers = self._training_workers()
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
                newer = [n for n in held_checkpoints(state.checkpoint_dir) if n > spec.resume_from]
                if newer:  # the folder's run goes on from an earlier point, as TensorFlow's Saver does: said
                    state.event(
                        f"checkpoint_dir {state.checkpoint_dir} also holds {', '.join(newer)}, newer than "
                        f"{spec.resume_from}: this job writes its own checkpoints over those of the same steps"
                    )
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
        state.watching = True
        self.thread.start()

    def _training_workers(self) -> list[str]:
        """The training workers the replicas start on, one each; when the cluster has fewer now than ``cg.train``
        counted (lost since), the job says so and waits up to ``timeout_s`` for them, then fails saying how many
        there are. Before, it started only as many replicas as there were workers, without a word: a sync step
        then waited for gradients that no replica would send, and a cluster without any finished at step 0."""
        state, spec = self.state, self.state.spec
        cluster = state.cluster
        workers = cluster.training_workers()
        if len(workers) >= spec.replicas:
            return workers[: spec.replicas]
        deadline = time.monotonic() + spec.timeout_s
        state.event(
            f"the job waits for training workers: its {spec.replicas} replica(s) need {spec.replicas} and the cluster "
            f"at {cluster.scheduler_address} has {len(workers)} now; it waits up to {spec.timeout_s:g} s for them "
            "to join, then fails"
        )
        while len(workers) < spec.replicas:
            if time.monotonic() > deadline:
                have = (
                    no_training_worker(cluster, spec.replicas)
                    if not workers
                    else (
                        f"the cluster at {cluster.scheduler_address} has {len(workers)} training worker(s): pass "
                        f"replicas={len(workers)}, or add a training worker"
                    )
                )
                raise TrainingError(
                    f"its {spec.replicas} replica(s) need {spec.replicas} training worker(s), and none more joined "
                    f"within timeout_s={spec.timeout_s:g} s: {have}"
                )
            if state.stopping or state.cluster.closed:  # closed while it waits (job.close() sets stopping)
                raise TrainingError("it was closed while it waited for training workers")
            time.sleep(WORKERS_POLL_S)
            workers = cluster.training_workers()
        state.event(f"training workers joined: {len(workers)} now")
        return workers[: spec.replicas]

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
            if state.closed.is_set() or state.cluster.closed or state.scheduler_lost():
                return
            state.error = TrainingError(f"job {state.job_id}: its supervisor failed: {type(err).__name__}: {err}")
            state.event(str(state.error))
            with contextlib.suppress(Exception):
                state.signal_stop()
        finally:
            state.watching = False

    def _watch(self) -> None:
        """Follow the step and the checkpoints; replace what was lost; notice the end."""
        state = self.state
        next_look = time.monotonic() + WORKERS_POLL_S
        while not state.closed.is_set():
            if state.cluster.closed:
                return  # closed under the job: its tasks and servers went with it
            if state.scheduler_lost():
                return  # the job has failed, saying so: Dask cancelled its tasks, and nothing can be asked of it
            if time.monotonic() >= next_look:
                self.watch.look()
                next_look = time.monotonic() + WORKERS_POLL_S
            self.replicas.note_starts()
            self._note_worker_records()
            if not state.stopping and state.error is None:
                if not self._note_failures() or not self.replicas.replace_lost():
                    continue  # the job has failed: the loop goes on until the other replicas have ended
            done = state.ended()
            if state.servers_lost:  # failed: every call to them would wait its whole deadline; the replicas end
                if done:
                    self._finish()
                    return
                state.closed.wait(WATCH_S)
                continue
            asked = time.monotonic()
            try:
                # The servers' step, checkpoints and skipped updates; then the larger k of a job.scale that added
                # replicas, once they have all registered.
                self.replicas.apply_pending_k(self.steps.read())
                state.resend_replicas_to_aggregate()  # a k the servers did not answer (a server restarting)
                self.replicas.abandon_hung()
                done = state.ended()
            except ParameterServerError as err:
                if done:
                    self._finish()
                    return
                # A server that gives no answer to Stats (answered at once by a live one) within timeout_s is
                # stopped or cut off: lost as much as a dead one. Before, the job asked again and again, timeout_s
                # each time, and failed only when a replica gave up on it (4-5 times timeout_s after the loss).
                if err.code not in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
                    state.event(f"could not read the global step: {err}; the job goes on and asks again")
                elif state.error is None and not self.recovery.restart(err, since=asked):
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
            # A replica gives up on servers that stopped answering (a PS worker hung, or cut off) and never came
            # back: no other worker would do better, but not because of the replica's own code.
            servers_lost = error.startswith("ParameterServerError: ") and "stopped answering" in error  # no refusal
            why = (
                "a replica cannot train without its parameter servers, and they did not come back (job.events says "
                "what happened to them)"
                if servers_lost
                else "the same error would come back wherever it ran"
            )
            state.error = TrainingError(
                f"replica {i} of job {state.job_id} failed{where}: {error}. The job has failed at once ({why}); the "
                f"replica's traceback is in {state.log_path}"
            )
            state.servers_lost = servers_lost
            state.event(str(state.error))
            state.signal_stop()
            if not servers_lost:  # a call to servers that stopped answering would wait its whole deadline
                # The others finish their step: in sync mode one gradient makes it, so none waits for this replica's.
                state.set_replicas_to_aggregate(1, f"replica {i} failed")
            return False
        return True

    def _log(self, text: str) -> None:
        with open(self.state.log_path, "a", encoding="utf-8") as log:
            log.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n")

    def _finish(self) -> None:
        state = self.state
        self._note_worker_records()
        if state.error is None:
            self._note_failures()
        if state.error is None:
            failed = [
                f
                for i, f in enumerate(state.futures)
                if f.status in ("error", "cancelled") and i not in state.abandoned
            ]
            if failed:
                state.error = (
                    failed[0].exception() if failed[0].status == "error" else TrainingError("its task was cancelled")
                )
                state.event(f"replica {state.futures.index(failed[0])} failed: {state.error}")
        if state.error is not None:
            return
        if not self.steps.save("final") and not state.closed.is_set() and not self._servers_answer():
            return
        state.event(f"{'stopped' if state.stopping else 'finished'} at global step {state.step}")

    def _servers_answer(self) -> bool:
        """After a final checkpoint that failed: whether the servers still hold the trained values (and the step).

        A PS worker lost after the replicas had ended and before the final checkpoint took the values trained since
        the last checkpoint with it: the job said 'finished at global step 62' (its last look) of 80, and
        ``job.variables()`` raised the lost server's raw error. It fails now, saying what was lost.
        """
        state = self.state
        try:
            state.step = state.global_step()
            return True
        except CellgraphError as err:
            self.recovery.find_newer_checkpoint()  # written since the job's last look, just before the loss
            since = (
                f"{state.restore_point} (global step {state.restore_step})"
                if state.restore_point
                else "the start (no checkpoint was written)"
            )
            again = f"cg.train(..., resume_from={state.restore_point!r})" if state.restore_point else "cg.train(...)"
            state.error = TrainingError(
                f"job {state.job_id} has failed: its replicas had ended, then its parameter server(s) did not answer "
                f"the final checkpoint or since: {err}. The values trained since {since} went with them; {again} "
                "trains those steps again"
            )
            state.servers_lost = True
            state.event(str(state.error))
            return False

    # ------------------------------------------------------------------ closing
    def close(self) -> None:
        """End the job in order: replicas told to stop, the supervisor's thread ended, tasks cancelled, servers
        stopped. Each step has a deadline, and one that fails does not keep the next from running (``job_close``)."""
        close_job(self.state, self.thread)


__all__ = ["CLOSE_ERRORS", "WATCHER_JOIN_S", "WATCH_S", "Supervisor"]
