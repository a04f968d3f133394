"""``cg.train``: launch a distributed training job on a cluster, and the ``Job`` that follows it.

``train`` checks everything it can before starting anything (the cluster, the
replicas, the data, the batch size, the loss), then starts the job's
parameter servers inside the cluster's PS workers, gives them the model,
scatters one data shard to each training worker, and submits one long-lived
replica task per shard. It returns at once: the notebook kernel stays free.
Metrics come back as Dask events; the ``Job`` collects them.

Lost processes. The job's watcher thread looks at the cluster's workers every
``WORKERS_POLL_S`` and says in ``job.events`` which worker was lost (address,
name, role, task index, last seen), what ran there, and what happens next.

- A training worker: its replica task is released by the scheduler (a worker
  that dies under a task counts against the task's ``allowed-failures``, 3 by
  default, not its ``retries``). Its data shard was scattered to that worker
  and has no lineage, so Dask forgets the task (its future is cancelled) rather
  than run it again; a second copy on another worker would not help, as the
  scheduler's active memory manager drops extra replicas within seconds. So
  the job submits the replica again itself, with its shard scattered afresh
  from this process, on a training worker that runs no task, as the scheduler
  sees it (the restarted one, once it is back: the job waits up to
  ``IDLE_WORKER_WAIT_S`` for one), else on the least loaded; the event says
  which and why. The replica registers again and goes on from the servers'
  global step. In sync mode the others go on meanwhile if they are
  at least ``replicas_to_aggregate``.
- A parameter server: the watcher's calls to it fail (``UNAVAILABLE``); the
  nanny restarts the PS worker and the scheduler sends it the job's plugin,
  which starts a new server; the job gives it the job (``init``), restores the
  last checkpoint it wrote, and publishes the new addresses in the
  ``distributed.Variable`` ``ps_variable(job_id)``, where the replicas look
  when their servers stop answering. The event says how many steps were lost:
  at most ``checkpoint_every``, as the servers checkpoint by themselves at
  every multiple of it (each copies its shard at exactly that step and writes
  it in the background); the job learns of each checkpoint from ``Stats``.

Examples
--------
>>> import cellgraph as cg  # doctest: +SKIP
>>> with cg.Cluster.local(workers=2, ps=1) as cluster:  # doctest: +SKIP
...     job = cg.train(loss, data=(x_train, y_train), optimizer=cg.optim.Adam(1e-2), cluster=cluster, steps=300)
...     job.wait(timeout=120)
...     trained = job.variables()
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from cellgraph.dataflow.errors import CellgraphError
from cellgraph.dataflow.graph import Tensor
from cellgraph.dataflow.optimizers import SGD, Adam, Momentum, Optimizer
from cellgraph.dataflow.session import Session

from .cluster import Cluster, ClusterError, WorkerInfo, call_with_deadline
from .errors import ParameterServerError
from .ps import OptimizerConfig, ParameterClient, TrainingConfig, new_token
from .ps.checkpoint import list_checkpoints
from .ps.config import NONFINITE, NonFinite
from .replica import METRIC_KEYS, ReplicaSpec, metrics_topic, run_replica
from .training_graph import TrainingError, TrainingGraph, prepare

Status = Literal["running", "finished", "failed", "stopped"]
# How often a replica looks at the job's stop flag (a call to the scheduler), at most.
STOP_POLL_S = 0.25
# How often the job looks at the parameter servers' step, to checkpoint and to notice the end.
WATCH_S = 0.2
# How long close() waits for the watcher to end; it is busy with at most one call, each with its own deadline.
WATCHER_JOIN_S = 10.0
# How often the job looks at the cluster's workers, to say which one was lost or joined.
# Polling the scheduler (two small calls) rather than a SchedulerPlugin: it needs no code of ours on the
# scheduler, which a cluster someone else started (Cluster.connect, from_client) may not have, and nothing to
# remove when the job ends.
WORKERS_POLL_S = 0.5
# The deadline of the calls the watcher makes to look at one parameter server, and of a replica's look-up.
PROBE_TIMEOUT_S = 5.0


# What close() lets pass while it ends the job: the cluster may be closed or gone already (a closed Client raises
# RuntimeError or OSError), and then nothing of the job is left to stop.
CLOSE_ERRORS = (ClusterError, ParameterServerError, AttributeError, OSError, TimeoutError, RuntimeError)

# How many times the job submits a lost replica again before it gives up on the job.
MAX_RESUBMITS = 3
# How long a lost replica waits for an idle training worker (the lost worker's replacement, which its nanny
# starts) before it goes to the least loaded one, where it shares the threads of a running replica.
IDLE_WORKER_WAIT_S = 60.0


def replicas_topic(job_id: str) -> str:
    """The Dask event topic on which each replica task says where it runs, as it starts."""
    return f"cellgraph-{job_id}-replicas"


def ps_variable(job_id: str) -> str:
    """The ``distributed.Variable`` holding job ``job_id``'s current PS addresses: ``{"generation", "addresses"}``."""
    return f"cellgraph-ps-{job_id}"


def optimizer_config(optimizer: Optimizer | OptimizerConfig | None) -> OptimizerConfig:
    """The parameter servers' form of ``cg.optim.SGD``, ``Momentum`` or ``Adam`` (default ``Adam(1e-3)``)."""
    if optimizer is None:
        return OptimizerConfig("adam", 1e-3)
    if isinstance(optimizer, OptimizerConfig):
        return optimizer
    if isinstance(optimizer, Adam):
        return OptimizerConfig(
            "adam", optimizer.learning_rate, beta1=optimizer.beta1, beta2=optimizer.beta2, epsilon=optimizer.epsilon
        )
    if isinstance(optimizer, Momentum):
        return OptimizerConfig(
            "momentum", optimizer.learning_rate, momentum=optimizer.momentum, nesterov=optimizer.nesterov
        )
    if isinstance(optimizer, SGD):
        return OptimizerConfig("sgd", optimizer.learning_rate)
    raise TrainingError(
        f"optimizer {optimizer!r} is not one the parameter servers run: use cg.optim.SGD, cg.optim.Momentum or cg.optim.Adam"
    )


class _ThrottledEvent:
    """Whether any of some ``distributed.Event``s is set (the job's stop flag, and this replica's own, which
    ``job.scale`` sets), read at most every ``STOP_POLL_S``: each read is a call to the scheduler."""

    def __init__(self, *names: str) -> None:
        import distributed

        self._events = [distributed.Event(name) for name in names]
        self._checked = 0.0
        self._set = False

    def is_set(self) -> bool:
        now = time.monotonic()
        if not self._set and now - self._checked >= STOP_POLL_S:
            self._checked = now
            self._set = any(event.is_set() for event in self._events)
        return self._set


class _PublishedAddresses:
    """A replica's ``locate``: the addresses the job published in its ``distributed.Variable``."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self) -> tuple[int, list[str]]:
        import distributed

        value = distributed.Variable(self.name).get(timeout=PROBE_TIMEOUT_S)
        return int(value["generation"]), [str(a) for a in value["addresses"]]


def _replica_task(spec: ReplicaSpec, data: Sequence[np.ndarray], stop_event: str, addresses: str) -> dict[str, Any]:
    """What runs on a training worker: one replica, until the job's last step or its stop flag."""
    from distributed import get_worker

    worker = get_worker()
    worker.log_event(replicas_topic(spec.job_id), {"replica": spec.replica_id, "worker": worker.address})
    stop = _ThrottledEvent(stop_event, replica_stop_name(stop_event, spec.replica_id))
    return run_replica(spec, data, stop=stop, locate=_PublishedAddresses(addresses))


def replica_stop_name(stop_event: str, replica: int) -> str:
    """The name of the ``distributed.Event`` that tells one replica to leave the job (``job.scale``)."""
    return f"{stop_event}-replica-{replica}"


def _arrays_for(tg: TrainingGraph, data: Any) -> list[Any]:
    """``data`` as one array per placeholder of ``tg``, in ``tg.placeholders`` order: NumPy arrays, and
    ``dask.array`` arrays as they are (they are computed on the workers, never in this process)."""
    wanted = tg.placeholders
    if isinstance(data, Mapping):
        by_name = {(k.name if isinstance(k, Tensor) else str(k)): v for k, v in data.items()}
        by_name = {(k if ":" in k else f"{k}:0"): v for k, v in by_name.items()}
        missing = [p for p in wanted if p not in by_name]
        if missing:
            raise TrainingError(
                f"no data for placeholder(s) {', '.join(map(repr, missing))}, which the loss needs; "
                f"data has {', '.join(map(repr, by_name)) or 'nothing'}"
            )
        return [_array(by_name[p], p) for p in wanted]
    if isinstance(data, (tuple, list)):
        if len(data) != len(wanted):
            raise TrainingError(
                f"data has {len(data)} array(s) but the loss needs {len(wanted)} placeholder(s) "
                f"({', '.join(map(repr, wanted))}): give one array per placeholder, in that order, "
                "or a dict {placeholder: array}"
            )
        return [_array(a, p) for a, p in zip(data, wanted, strict=True)]
    raise TrainingError(f"data must be a tuple of arrays or a dict {{placeholder: array}}, got {type(data).__name__}")


def _array(value: Any, placeholder: str) -> Any:
    """A NumPy array, or a ``dask.array`` whose rows are known (a replica's shard is a slice of them)."""
    import dask.array as da

    if not isinstance(value, da.Array):
        return np.asarray(value)
    if value.ndim == 0 or math.isnan(value.shape[0]):
        raise TrainingError(
            f"the dask array for placeholder {placeholder!r} has {'no rows' if value.ndim == 0 else 'unknown chunk sizes'}"
            ": call .compute_chunk_sizes() on it first, so that its rows can be split over the replicas"
        )
    return value


def _rows(array: Any) -> int:
    return int(array.shape[0]) if array.ndim else 0


def train(
    loss: Tensor,
    data: Any,
    *,
    cluster: Cluster,
    optimizer: Optimizer | OptimizerConfig | None = None,
    replicas: int = 2,
    batch_size: int = 64,
    steps: int = 1000,
    mode: Literal["sync", "async"] = "sync",
    replicas_to_aggregate: int | None = None,
    max_staleness: int | None = None,
    checkpoint_every: int | None = 100,
    checkpoint_dir: str | Path | None = None,
    resume_from: str | None = None,
    nonfinite: NonFinite = "reject",
    seed: int = 0,
    metrics_interval_s: float = 0.5,
    timeout_s: float = 60.0,
) -> Job:
    """Train ``loss`` on ``cluster`` with ``replicas`` replicas; return the running ``Job`` at once.

    Parameters
    ----------
    loss
        A scalar float tensor; every trainable variable it depends on is trained.
    data
        One array per placeholder the loss needs, in the order they were made
        (``(x_train, y_train)``), or a dict ``{placeholder: array}``. Rows are
        split evenly over the replicas.
    cluster
        A ``cg.Cluster``; replicas run on its training workers, the
        parameter servers in its PS workers.
    mode, replicas_to_aggregate, max_staleness
        ``"sync"``: each step averages the first ``replicas_to_aggregate``
        gradients (default: all replicas; fewer leaves backup workers);
        ``"async"``: each gradient is applied on arrival, within
        ``max_staleness`` versions.
    checkpoint_every, checkpoint_dir
        The parameter servers checkpoint at every multiple of
        ``checkpoint_every`` global steps (and the job at the end) into
        ``checkpoint_dir`` (by default a new temporary folder, which the job
        leaves for ``resume_from``), which every PS worker must reach; a lost parameter
        server costs at most that many steps. ``resume_from`` restores a
        checkpoint (a name in ``checkpoint_dir``, e.g. ``"ckpt-0000000300"``) first.
    nonfinite
        What a gradient holding NaN or Inf does at the parameter servers:
        ``"reject"`` (the push fails with an error naming the variable),
        ``"skip_step"`` (that step's update is dropped, the step still
        advances, and the servers count it in ``Stats.steps_skipped``) or
        ``"apply"``.
    timeout_s
        The deadline of every call to the parameter servers, and of the wait
        for a lost one to be restarted.
    """
    if not isinstance(cluster, Cluster) or cluster.closed:
        raise TrainingError("cg.train needs an open cluster: cluster=cg.Cluster.local() (or Cluster.connect(address))")
    workers = cluster.training_workers()
    problems = []
    if replicas < 1:
        problems.append(f"replicas must be at least 1, got {replicas}")
    elif replicas > len(workers):
        problems.append(
            f"{replicas} replicas need {replicas} training workers and the cluster has {len(workers)}: "
            f"pass replicas={len(workers)}, or start the cluster with workers={replicas}"
        )
    if mode not in ("sync", "async"):
        problems.append(f"mode must be 'sync' or 'async', got {mode!r}")
    k = replicas if replicas_to_aggregate is None else replicas_to_aggregate
    if mode == "sync" and not 1 <= k <= max(replicas, 1):
        problems.append(f"replicas_to_aggregate must be between 1 and replicas ({replicas}), got {k}")
    if batch_size < 1 or steps < 0:
        problems.append(f"batch_size must be at least 1 and steps 0 or more, got {batch_size} and {steps}")
    if checkpoint_every is not None and checkpoint_every < 1:
        problems.append(f"checkpoint_every must be at least 1 (or None), got {checkpoint_every}")
    if nonfinite not in NONFINITE:
        problems.append(f"nonfinite must be one of {', '.join(map(repr, NONFINITE))}, got {nonfinite!r}")
    if problems:
        raise TrainingError("cg.train: " + "; ".join(problems))
    config = optimizer_config(optimizer)
    tg = prepare(loss)
    arrays = _arrays_for(tg, data)
    rows = {p: _rows(a) for p, a in zip(tg.placeholders, arrays)}
    if len(set(rows.values())) != 1:
        raise TrainingError(
            "data arrays must have the same number of rows, got " + ", ".join(f"{p}: {n}" for p, n in rows.items())
        )
    total = next(iter(rows.values()))
    shard_rows = total // replicas
    if batch_size > shard_rows:
        raise TrainingError(
            f"batch_size {batch_size} is larger than a replica's shard ({shard_rows} rows: {total} over {replicas} "
            f"replicas): pass batch_size<={shard_rows}, or fewer replicas"
        )
    training = TrainingConfig(mode, k if mode == "sync" else 1, max_staleness, checkpoint_every or 0, nonfinite)
    return Job._start(
        cluster, tg, arrays, config, training, replicas, batch_size, steps, checkpoint_every,
        checkpoint_dir, resume_from, seed, metrics_interval_s, timeout_s, loss,
    )  # fmt: skip


class Job:
    """A running (or ended) training job: its status, metrics, trained variables, and controls.

    Made by ``cg.train``; do not construct it directly.
    """

    def __init__(self) -> None:
        self.job_id = ""
        self.cluster: Cluster
        self.graph: TrainingGraph
        self.loss: Tensor
        self.checkpoint_every: int | None = None
        self.checkpoint_dir = Path()
        self._stop_name = ""
        self.metrics: list[dict[str, Any]] = []
        self.events: list[str] = []
        self.checkpoints: list[str] = []
        self.replicas = 0
        self.steps = 0
        self._lock = threading.Lock()
        self._stopping = False
        self._closed = False
        self._error: BaseException | None = None
        self._futures: list[Any] = []
        self._watcher: threading.Thread | None = None
        self._ps: ParameterClient | None = None
        # What restarting a lost parameter server takes: the job as first given, and where it was last saved.
        self._token = ""
        self._optimizer = OptimizerConfig()
        self._training = TrainingConfig()
        self._timeout_s = 60.0
        self._addresses: list[str] = []
        self._generation = 0
        self._restore_point = ""
        self._restore_step = -1
        self._checkpoint_errors: set[str] = set()
        # What the watcher saw: the workers (as of its last look), when each was last seen, where each replica runs,
        # and the global step (when, and how fast it moves).
        self._workers: dict[str, WorkerInfo] = {}
        self._last_seen: dict[str, float] = {}
        self._replica_at: dict[int, str] = {}
        self._placed: dict[int, str] = {}  # _replica_at as of the last look at the workers
        self._lost: dict[str, WorkerInfo] = {}  # the workers found gone, as they were last seen
        self._shards: list[list[Any]] = []
        self._specs: list[ReplicaSpec] = []
        self._resubmits: dict[int, int] = {}
        self._submitted_to: dict[int, str] = {}  # the worker each replica's task was last submitted to
        self._idle_deadline: dict[int, float] = {}  # lost replicas waiting for an idle training worker: until when
        self._skipped_seen: dict[int, int] = {}  # per shard: the steps_skipped already reported as an event
        self._removed: set[int] = set()  # replicas job.scale told to leave
        self._pending_k: tuple[int, set[int]] | None = None  # see _apply_pending_k
        self._arrays: list[Any] = []  # the whole data, for replicas job.scale adds
        self._batch_size = 0
        self._step = 0
        self._step_time = time.monotonic()
        self._step_rate = 0.0

    # ------------------------------------------------------------------ starting
    @classmethod
    def _start(
        cls,
        cluster: Cluster,
        tg: TrainingGraph,
        arrays: list[Any],
        optimizer: OptimizerConfig,
        training: TrainingConfig,
        replicas: int,
        batch_size: int,
        steps: int,
        checkpoint_every: int | None,
        checkpoint_dir: str | Path | None,
        resume_from: str | None,
        seed: int,
        metrics_interval_s: float,
        timeout_s: float,
        loss: Tensor,
    ) -> Job:
        import distributed

        job = cls()
        job.job_id = f"job-{uuid.uuid4().hex[:8]}"
        job.cluster, job.graph, job.loss, job.replicas, job.steps = cluster, tg, loss, replicas, steps
        job.checkpoint_every = checkpoint_every
        job.checkpoint_dir = Path(checkpoint_dir or tempfile.mkdtemp(prefix=f"cellgraph-{job.job_id}-"))
        token = new_token()
        job._token, job._optimizer, job._training, job._timeout_s = token, optimizer, training, timeout_s
        client = cluster.client
        addresses = cluster.start_parameter_servers(job.job_id, token, job.checkpoint_dir)
        job._addresses = list(addresses)
        try:
            job._ps = ParameterClient(addresses, token, timeout=timeout_s)
            job._ps.init(job.job_id, tg.initial, optimizer, training)
            if resume_from:
                step = job._step = job._ps.restore(resume_from)
                job._restore_point, job._restore_step = resume_from, step
                job._event(f"resumed from checkpoint {resume_from} at global step {step}")
            job._publish_addresses()
            client.subscribe_topic(metrics_topic(job.job_id), job._on_metrics)
            client.subscribe_topic(replicas_topic(job.job_id), job._on_replica_start)
            job._stop_name = f"cellgraph-stop-{job.job_id}"
            distributed.Event(job._stop_name, client=client).clear()
            workers = cluster.training_workers()[:replicas]
            per = _rows(arrays[0]) // replicas
            job._arrays, job._batch_size = arrays, batch_size
            for i, worker in enumerate(workers):
                job._shards.append([a[i * per : (i + 1) * per] for a in arrays])
                job._specs.append(
                    ReplicaSpec(
                        job.job_id,
                        i,
                        tg,
                        addresses,
                        token,
                        training.mode,
                        batch_size,
                        steps,
                        seed + i,
                        metrics_interval_s,
                        timeout_s,
                    )  # fmt: skip
                )
                job._futures.append(job._submit(i, worker))
        except BaseException:
            job.close()
            raise
        job._event(
            f"started {replicas} replica(s) in {training.mode} mode on {', '.join(workers)}; PS at {', '.join(addresses)}"
        )
        job._look_at_workers()
        job._watcher = threading.Thread(target=job._watch, name=f"cellgraph-{job.job_id}-watch", daemon=True)
        job._watcher.start()
        return job

    def _submit(self, i: int, worker: str) -> Any:
        """Send replica ``i``'s shard to ``worker`` and submit its task there (elsewhere if it is gone).

        A NumPy array's rows are scattered from this process; a ``dask.array``'s rows are computed on the
        workers that hold (or load) its partitions, and go from there to the replica's worker.
        """
        import dask.array as da

        client = self.cluster.client
        held = [
            client.compute(part) if isinstance(part, da.Array) else client.scatter(part, workers=[worker], hash=False)
            for part in self._shards[i]
        ]
        attempt = self._resubmits.get(i, 0)
        self._submitted_to[i] = worker
        return client.submit(
            _replica_task,
            self._specs[i],
            held,
            self._stop_name,
            ps_variable(self.job_id),
            key=f"cellgraph-replica-{self.job_id}-{i}" + (f"-again-{attempt}" if attempt else ""),
            workers=[worker],
            allow_other_workers=True,
            pure=False,
            retries=3,
        )

    # ------------------------------------------------------------------ what comes back
    def _on_replica_start(self, event: tuple[float, dict[str, Any]]) -> None:
        _, message = event
        i, address = int(message["replica"]), str(message["worker"])
        before, self._replica_at[i] = self._replica_at.get(i), address
        if before is not None:
            there = self._workers.get(address)
            at = f"{address} (name {there.name}, role {there.role}, task {there.task})" if there else address
            self._event(f"replica {i} runs again, on {at}: it rejoins the job at the servers' global step")

    def _on_metrics(self, event: tuple[float, dict[str, Any]]) -> None:
        _, message = event
        with self._lock:
            self.metrics.append(dict(message))

    def _event(self, text: str) -> None:
        with self._lock:
            self.events.append(f"{time.strftime('%H:%M:%S')} {text}")

    def _publish_addresses(self) -> None:
        """Tell the replicas where the servers are now (they read it when theirs stop answering)."""
        import distributed

        value = {"generation": self._generation, "addresses": list(self._addresses)}
        distributed.Variable(ps_variable(self.job_id), client=self.cluster.client).set(value)

    def _watch(self) -> None:
        """Follow the step and the checkpoints; say which worker was lost; restart lost parameter servers; notice
        the end."""
        next_look = time.monotonic() + WORKERS_POLL_S
        while not self._closed:
            if time.monotonic() >= next_look:
                self._look_at_workers()
                next_look = time.monotonic() + WORKERS_POLL_S
            if not self._stopping and self._error is None and not self._replace_lost_replicas():
                return
            done = self._ended()
            try:
                self._read_step()
            except ParameterServerError as err:
                if done:
                    self._finish()
                    return
                if err.code != "UNAVAILABLE":
                    self._event(f"could not read the global step: {err}; the job goes on and asks again")
                elif not self._restart_parameter_servers(err):
                    return
                continue
            except CellgraphError as err:
                self._event(f"could not read the global step: {err}; the job goes on and asks again")
            if done:
                self._finish()
                return
            time.sleep(WATCH_S)

    def _replace_lost_replicas(self) -> bool:
        """Submit again each replica whose task Dask gave up (it lost its worker); False if the job failed."""
        for i, future in enumerate(self._futures):
            if self._closed:
                return True  # close() cancels every replica's task: those are not lost, and not replaced
            if i in self._removed:
                continue  # told to leave by job.scale: not replaced
            if future.status != "cancelled" and not (
                future.status == "error" and type(future.exception()).__name__ == "KilledWorker"
            ):
                continue
            attempt = self._resubmits.get(i, 0) + 1
            if attempt > MAX_RESUBMITS:
                self._error = TrainingError(
                    f"replica {i} of job {self.job_id} lost its worker {MAX_RESUBMITS + 1} times; the job has failed: "
                    f"job.close() ends it, and cg.train(..., resume_from=...) with a checkpoint of job.checkpoints "
                    "starts again"
                )
                self._event(str(self._error))
                self._signal_stop()
                return False
            first_look = i not in self._idle_deadline
            if first_look:
                self._idle_deadline[i] = time.monotonic() + IDLE_WORKER_WAIT_S
            placement = self._placement(i)
            if placement is None:
                if first_look:
                    self._event(
                        f"replica {i} waits for an idle training worker: every training worker runs a replica; "
                        f"the job waits up to {IDLE_WORKER_WAIT_S:g} s for the lost worker's replacement to join, "
                        "then submits it again on the least loaded one"
                    )
                continue
            target, why = placement
            self._resubmits[i] = attempt
            try:
                self._futures[i] = self._submit(i, target)
            except Exception as err:  # noqa: BLE001 - the scheduler busy: the next look tries again
                self._resubmits[i] -= 1
                self._event(f"could not submit replica {i} again ({err}); the job tries again at its next look")
                continue
            del self._idle_deadline[i]
            self._event(
                f"replica {i}'s task was lost with its worker ({future.status}): submitted again {why}, "
                f"with its shard (attempt {attempt} of {MAX_RESUBMITS})"
            )
        return True

    def _placement(self, i: int) -> tuple[str, str] | None:
        """Where lost replica ``i`` goes, and why: an idle training worker, else (once its wait for one is over)
        the least loaded; None to look again later (no idle one yet, or the scheduler did not answer)."""
        load = self._training_load(i)
        idle = [a for a, tasks in load.items() if tasks == 0]
        if idle:
            return idle[0], f"on idle worker {idle[0]}: no replica runs there"
        if not load or time.monotonic() < self._idle_deadline[i]:
            return None
        least = min(load, key=load.__getitem__)  # the first in task order among equals
        return least, (
            f"on {least}, the least loaded: every training worker runs a replica "
            f"(tasks per worker: {', '.join(f'{a} {n}' for a, n in load.items())})"
        )

    def _training_load(self, i: int) -> dict[str, int]:
        """Tasks per training worker, in task order, as the scheduler sees them now, plus the replicas other than
        ``i`` submitted to a worker that the scheduler has not placed yet; empty when it did not answer."""
        # A look at the workers first: the task was lost because the scheduler removed its worker, and a worker
        # that joined is known by name, so the events say that one left and this one joined before a replica
        # goes there.
        self._look_at_workers()
        try:
            processing = self.cluster.processing()
        except Exception:  # noqa: BLE001 - the scheduler busy or the cluster closing: look again next time
            return {}
        # Workers in both views: the look keeps its last view when the scheduler does not answer.
        load = {a: len(processing[a]) for a, w in self._workers.items() if w.role == "worker" and a in processing}
        placed = {key for keys in processing.values() for key in keys}
        for j, future in enumerate(self._futures):
            to = self._submitted_to.get(j)
            if j != i and to in load and not future.done() and future.key not in placed:
                load[to] += 1
        return load

    def _read_step(self) -> int:
        """The global step, how fast it moves (steps per second, smoothed), and the servers' checkpoints."""
        if self._ps is None:
            raise TrainingError(f"job {self.job_id} has no parameter servers")
        stats = self._ps.stats()
        step, now = min(s.global_step for s in stats), time.monotonic()
        if step > self._step and now > self._step_time:
            rate = (step - self._step) / (now - self._step_time)
            self._step_rate = rate if self._step_rate == 0 else 0.5 * (self._step_rate + rate)
        self._step, self._step_time = step, now
        self._note_checkpoints(stats)
        self._note_skipped_steps(stats)
        self._apply_pending_k(stats)
        return step

    def _note_skipped_steps(self, stats: Sequence[Any]) -> None:
        """Say when a shard dropped an update for a NaN or Inf gradient (``nonfinite="skip_step"``)."""
        for shard, s in enumerate(stats):
            seen = self._skipped_seen.get(shard, 0)
            if s.steps_skipped > seen:
                self._skipped_seen[shard] = s.steps_skipped
                self._event(
                    f"parameter server {shard} skipped {s.steps_skipped - seen} update(s) for a non-finite gradient "
                    f"({s.steps_skipped} in all; last: {s.last_skipped}); nonfinite='skip_step' keeps training"
                )

    def _note_checkpoints(self, stats: Sequence[Any]) -> None:
        """Record the newest checkpoint every shard has written (the restore point), and say why one failed."""
        written = [(s.latest_checkpoint_step, s.latest_checkpoint) for s in stats]
        if all(name for _, name in written):
            step, name = min(written)  # the shards keep their last few: the oldest newest one is on all of them
            if step > self._restore_step:
                self._restore_point, self._restore_step = name, step
                if name not in self.checkpoints:
                    with self._lock:
                        self.checkpoints.append(name)
                    self._event(
                        f"checkpoint {name} written (every {self.checkpoint_every} steps) in {self.checkpoint_dir}"
                    )
        for s in stats:
            if s.checkpoint_error and s.checkpoint_error not in self._checkpoint_errors:
                self._checkpoint_errors.add(s.checkpoint_error)
                self._event(
                    f"parameter server shard {s.shard}: {s.checkpoint_error}; the job goes on, and a lost server "
                    f"would restart from {self._restore_point or 'the initial values'}"
                )

    # ------------------------------------------------------------------ lost workers
    def _look_at_workers(self) -> None:
        """Compare the cluster's workers and where the replicas run with the last look; say what changed."""
        try:
            rows = self.cluster.workers()
        except Exception:  # noqa: BLE001 - the scheduler busy or the cluster closing: look again next time
            return
        now = time.monotonic()
        current = {w.address: w for w in rows}
        gone = [a for a in self._workers if a not in current]
        for address in gone:
            self._lost[address] = self._workers[address]
            self._event(self._lost_worker(self._workers[address], now, gone))
        for address, info in current.items():
            if self._workers and address not in self._workers:
                self._event(f"worker {address} joined (name {info.name}, role {info.role}, task {info.task})")
        self._workers = current
        self._placed = dict(self._replica_at)
        self._last_seen.update(dict.fromkeys(current, now))

    def _lost_worker(self, info: WorkerInfo, now: float, gone: Sequence[str]) -> str:
        """The event for a lost worker: who it was, what ran there, and what happens next."""
        ago = now - self._last_seen.get(info.address, now)
        text = (
            f"lost worker {info.address} (name {info.name}, role {info.role}, task {info.task}; "
            f"last seen {ago:.1f} s ago)"
        )
        if info.role == "ps":
            return (
                text + f", which hosted shard {info.task} of the job's parameter servers: Dask restarts the worker, "
                "and the job restarts the server there and restores the last checkpoint"
            )
        # Where the replicas ran at the last look: a lost replica may be running again elsewhere by now.
        lost = sorted(i for i, a in self._placed.items() if a == info.address and self._futures[i].status != "finished")
        if not lost:
            return text + f", which ran no replica of job {self.job_id}: nothing to do"
        running = [
            i for i, f in enumerate(self._futures) if i not in lost and not f.done() and self._placed.get(i) not in gone
        ]
        text += (
            f", which ran replica {', '.join(map(str, lost))}: the job runs it again on an idle training worker "
            "(the restarted one once it is back) or else the least loaded, where it rejoins at the servers' "
            f"global step; meanwhile {len(running)} replica(s) go on"
        )
        k = self._training.replicas_to_aggregate
        if self._training.mode == "sync":
            text += f" ({k} gradients make a step" + (", so the job waits for it)" if len(running) < k else ")")
        return text

    # ------------------------------------------------------------------ lost parameter servers
    def _restart_parameter_servers(self, err: ParameterServerError) -> bool:
        """Servers stopped answering: wait for Dask to restart them, restore, publish; False if the job failed."""
        # The replicas' metrics may have seen a later step than the watcher's last look.
        with self._lock:
            reported = max((int(m.get("step", 0)) for m in self.metrics), default=0)
        seen_at, ago = max(self._step, reported), time.monotonic() - self._step_time
        dead = [a for a in self._addresses if not self._answers(a)]
        if not dead:
            self._event(f"the parameter servers answer again after: {err}")
            return True
        who = "; ".join(self._describe_server(a) for a in dead)
        self._find_newer_checkpoint()
        point = self._restore_point or "nothing (no checkpoint yet: training starts again from step 0)"
        self._event(
            f"{who} did not answer (last seen at global step {seen_at}, {ago:.1f} s ago): {err}. "
            f"The job waits up to {self._timeout_s:g} s for Dask to restart it, then restores {point}; "
            "the replicas wait for it and rejoin"
        )
        try:
            addresses = self.cluster.parameter_servers(self.job_id, timeout=self._timeout_s, replacing=dead)
            ps = ParameterClient(addresses, self._token, timeout=self._timeout_s)
            ps.init(self.job_id, self.graph.initial, self._optimizer, self._training)
            step = ps.restore(self._restore_point) if self._restore_point else 0
        except CellgraphError as problem:
            self._error = TrainingError(
                f"job {self.job_id}: its parameter server(s) {', '.join(dead)} were lost and could not be restarted: "
                f"{problem}. The job has failed: job.close() ends it, and "
                + (
                    f"cg.train(..., resume_from={self._restore_point!r}) starts again from its last checkpoint"
                    if self._restore_point
                    else "cg.train(...) starts it again"
                )
            )
            self._event(str(self._error))
            self._signal_stop()  # the replicas waiting for new servers end now, not at their deadline
            return False
        old, self._ps = self._ps, ps
        if old is not None:
            old.close()
        self._addresses, self._generation = list(addresses), self._generation + 1
        self._publish_addresses()
        self._step, self._step_time = step, time.monotonic()
        lost = max(0, seen_at - step)
        self._event(
            f"parameter server(s) of job {self.job_id} restarted at {', '.join(addresses)}; restored "
            f"{self._restore_point or 'the initial values'} at global step {step}: {lost} step(s) lost "
            f"(checkpoints at most every {self.checkpoint_every} steps); the replicas rejoin there"
        )
        return True

    def _find_newer_checkpoint(self) -> None:
        """Look in the checkpoint folder, where this process can read it, for a checkpoint newer than ``Stats`` last
        said (a server may have written one since, just before it was lost), complete on every shard."""
        shards = len(self._addresses)
        try:
            names = [
                {info.name: info.step for info in list_checkpoints(self.checkpoint_dir, s, shards)}
                for s in range(shards)
            ]
        except (CellgraphError, OSError):
            return  # the folder is on the PS machines only: Stats's account stands
        common = set(names[0]).intersection(*names[1:]) if names else set()
        if common:
            name = max(common, key=lambda n: names[0][n])
            if names[0][name] > self._restore_step:
                self._restore_point, self._restore_step = name, names[0][name]
                with self._lock:
                    self.checkpoints.append(name)

    def _answers(self, address: str) -> bool:
        """Whether the server at ``address`` answers ``Stats`` (within ``PROBE_TIMEOUT_S``)."""
        probe = ParameterClient([address], self._token, timeout=PROBE_TIMEOUT_S)
        try:
            probe.stats()
        except ParameterServerError:
            return False
        finally:
            probe.close()
        return True

    def _describe_server(self, address: str) -> str:
        shard = self._addresses.index(address)
        # The lost worker first: the watcher may have seen it go before its server was found silent.
        ps = [w for w in (*self._lost.values(), *self._workers.values()) if w.role == "ps" and w.task == shard]
        host = f"; worker {ps[0].address}, name {ps[0].name}, role ps, task {shard}" if ps else ""
        return f"parameter server {address} (shard {shard}{host})"

    def _finish(self) -> None:
        failed = [f for f in self._futures if f.status in ("error", "cancelled")]
        if failed:
            self._error = (
                failed[0].exception() if failed[0].status == "error" else TrainingError("its task was cancelled")
            )
            self._event(f"replica {self._futures.index(failed[0])} failed: {self._error}")
            return
        self._save("final")
        self._event(f"{'stopped' if self._stopping else 'finished'} at global step {self.global_step()}")

    def _save(self, why: str) -> bool:
        """Checkpoint every shard; whether it worked (a failure is an event, and the next look tries again)."""
        if self._ps is None:
            return False
        try:
            name = self._ps.save()
        except CellgraphError as err:
            self._event(f"checkpoint ({why}) failed: {err}")
            return False
        with self._lock:
            self.checkpoints.append(name)
        if "," not in name:  # shards at different steps save under different names: no restore point then
            self._restore_point, self._restore_step = name, max(self._restore_step, self._step)
        self._event(f"checkpoint {name} written ({why}) in {self.checkpoint_dir}")
        return True

    # ------------------------------------------------------------------ the public handle
    @property
    def status(self) -> Status:
        if self._error is not None or any(f.status == "error" for f in self._futures):
            return "failed"
        if not self._ended():
            return "running"
        return "stopped" if self._stopping else "finished"

    def global_step(self) -> int:
        """The parameter servers' global step (the lowest over the shards)."""
        if self._ps is None:
            raise TrainingError(f"job {self.job_id} has no parameter servers")
        return min(s.global_step for s in self._ps.stats())

    def ps_stats(self) -> list[dict[str, Any]]:
        """Each parameter-server shard's counters, in shard order, as plain dicts (for tables and widgets).

        Keys: ``shard``, ``address``, ``global_step``, ``bytes_in``, ``bytes_out``, ``updates``,
        ``pushes_applied``, ``pushes_stale``, ``pushes_rejected`` and ``calls`` (answered calls by RPC name).
        """
        if self._ps is None:
            raise TrainingError(f"job {self.job_id} is closed: its parameter servers are gone")
        return [
            {
                "shard": s.shard,
                "address": address,
                "global_step": s.global_step,
                "bytes_in": s.bytes_in,
                "bytes_out": s.bytes_out,
                "updates": s.updates,
                "pushes_applied": s.pushes_applied,
                "pushes_stale": s.pushes_stale,
                "pushes_rejected": s.pushes_rejected,
                "calls": dict(s.calls),
            }
            for address, s in zip(self._addresses, self._ps.stats(), strict=True)
        ]

    def wait(self, timeout: float | None = None) -> Job:
        """Block until every replica has ended (at most ``timeout`` s); raise the first replica's error."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._ended():
            if deadline is not None and time.monotonic() > deadline:
                raise TrainingError(
                    f"job {self.job_id} still running after {timeout} s, at global step {self._step} of "
                    f"{self.steps} (as last seen); job.stop() ends it; job.events says what it waits for"
                )
            time.sleep(0.05)
        if self._watcher is not None:
            self._watcher.join(timeout=30)
        if self._error is not None:
            raise TrainingError(str(self._error))
        for i, future in enumerate(self._futures):
            if future.status in ("error", "cancelled"):
                raise TrainingError(f"replica {i} of job {self.job_id} failed: {future.exception()}")
        return self

    def _ended(self) -> bool:
        """Whether every replica has ended; one whose task was lost with its worker is submitted again, unless the
        job is stopping or has failed."""
        settled = self._stopping or self._error is not None or self._closed
        return all(f.done() and (settled or f.status != "cancelled") for f in self._futures)

    def stop(self, timeout: float = 60.0) -> Job:
        """Let each replica finish its step, then end the job with a final checkpoint.

        A job that has already ended is left as it is (a finished job stays ``finished``).
        """
        if self.status != "running":
            return self
        self._stopping = True
        self._signal_stop()
        self._event("stop asked: replicas finish their step")
        # In sync mode a replica that has pushed waits for the others' gradients, and a replica that saw the flag
        # sends none: from now on each gradient makes a step of its own, so that none waits for one that will not
        # come (until its deadline).
        self._set_replicas_to_aggregate(1, "the job is stopping")
        return self.wait(timeout)

    def scale(self, replicas: int, timeout: float = 60.0) -> Job:
        """Train with ``replicas`` replicas from now on: start new ones, or let the newest ones leave.

        A new replica gets ``1/replicas`` of the data's rows (the others keep
        their shards), joins at the servers' global step and trains to the
        same last step. One told to leave finishes its step first. In sync
        mode a step takes as many gradients more (or fewer) as replicas were
        added (or removed), but at least 1: backup replicas stay backups.
        Checked before anything changes; raises ``TrainingError`` saying what
        to change.
        """
        active = self._active_replicas()
        workers = self.cluster.training_workers()
        if self.status != "running" or self._stopping:
            raise TrainingError(f"job {self.job_id} is {self.status}: only a running job can be scaled")
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
            raise TrainingError(f"job.scale needs a number of replicas of at least 1, got {replicas!r}")
        if replicas > len(workers):
            raise TrainingError(
                f"job.scale({replicas}): {replicas} replicas need {replicas} training workers and the cluster has "
                f"{len(workers)}: scale the cluster first, or ask for at most {len(workers)}"
            )
        change = replicas - len(active)
        if change == 0:
            return self
        k = max(1, self._training.replicas_to_aggregate + change)
        if change < 0:
            leaving = active[change:]
            # Fewer gradients make a step first, so that the replicas that stay never wait for a leaving one.
            self._set_replicas_to_aggregate(k, f"replica(s) {', '.join(map(str, leaving))} leave")
            import distributed

            for i in leaving:
                distributed.Event(replica_stop_name(self._stop_name, i), client=self.cluster.client).set()
                self._removed.add(i)
            self.replicas = replicas
            self._event(
                f"scaled to {replicas} replica(s): replica(s) {', '.join(map(str, leaving))} leave after their step"
            )
            return self.wait_for_replicas(timeout)
        busy = {self._replica_at.get(i) for i in active}
        free = [w for w in workers if w not in busy]
        total = _rows(self._arrays[0])
        per = total // replicas
        if per < self._batch_size:
            raise TrainingError(
                f"job.scale({replicas}): a new replica's shard would have {per} rows ({total} over {replicas}), "
                f"fewer than the batch size {self._batch_size}: ask for fewer replicas"
            )
        added = []
        for n, worker in enumerate(free[:change]):
            i = len(self._futures)
            part = (len(active) + n) % replicas
            self._shards.append([a[part * per : (part + 1) * per] for a in self._arrays])
            self._specs.append(dataclasses.replace(self._specs[0], replica_id=i, seed=self._specs[0].seed + i))
            self._futures.append(self._submit(i, worker))
            added.append(i)
        self.replicas = replicas
        # More gradients make a step once the new replicas have joined (the watcher sees them register): until
        # then a step does not wait for replicas that are still loading their graph.
        self._pending_k = (k, set(added)) if self._training.mode == "sync" else None
        self._event(
            f"scaled to {replicas} replica(s): replica(s) {', '.join(map(str, added))} start on "
            f"{', '.join(free[:change])}"
            + (f"; {k} gradients make a step once they have joined" if self._pending_k else "")
        )
        return self

    def wait_for_replicas(self, timeout: float = 60.0) -> Job:
        """Block until every replica told to leave has left (at most ``timeout`` s)."""
        deadline = time.monotonic() + timeout
        while not all(self._futures[i].done() for i in self._removed):
            if time.monotonic() > deadline:
                waiting = [i for i in self._removed if not self._futures[i].done()]
                raise TrainingError(
                    f"job {self.job_id}: replica(s) {', '.join(map(str, waiting))} told to leave are still running "
                    f"after {timeout} s; job.events says what they wait for"
                )
            time.sleep(0.05)
        return self

    def _active_replicas(self) -> list[int]:
        """The replicas that are part of the job now (not told to leave), in the order they were started."""
        return [i for i in range(len(self._futures)) if i not in self._removed]

    def _set_replicas_to_aggregate(self, k: int, why: str) -> None:
        """Sync mode: tell every shard that ``k`` gradients make a step from now on (an event if it fails)."""
        if self._training.mode != "sync" or self._ps is None or k == self._training.replicas_to_aggregate:
            return
        try:
            self._ps.reconfigure(k)
        except ParameterServerError as err:
            self._event(f"could not make steps of {k} gradient(s) ({why}): {err}")
            return
        self._training = dataclasses.replace(self._training, replicas_to_aggregate=k)
        self._event(f"{k} gradient(s) make a step from now on: {why}")

    def _apply_pending_k(self, stats: Sequence[Any]) -> None:
        """After ``scale`` added replicas: raise the gradients per step once all of them have registered."""
        if self._pending_k is None or self._stopping:
            return
        k, waiting = self._pending_k
        joined = {r.replica_id for r in stats[0].replicas}
        if waiting <= joined:
            self._pending_k = None
            self._set_replicas_to_aggregate(k, f"replica(s) {', '.join(map(str, sorted(waiting)))} joined")

    def _signal_stop(self) -> None:
        import distributed

        distributed.Event(self._stop_name, client=self.cluster.client).set()

    def variables(self) -> dict[str, np.ndarray]:
        """The trained values of every variable, from the parameter servers."""
        if self._ps is None:
            raise TrainingError(f"job {self.job_id} is closed: its parameter servers are gone")
        return self._ps.pull().values

    def metrics_frame(self) -> Any:
        """``job.metrics`` as a pandas ``DataFrame`` (one row per metrics message, ``METRIC_KEYS`` as columns)."""
        try:
            import pandas as pd
        except ImportError as err:
            raise TrainingError(
                "job.metrics_frame() needs pandas (pip install pandas); job.metrics holds the same as a list of dicts"
            ) from err
        with self._lock:
            rows = list(self.metrics)
        return pd.DataFrame(rows, columns=list(METRIC_KEYS))

    def evaluate(self, fetches: Any, data: Mapping[Any, Any]) -> Any:
        """Run ``fetches`` of the loss's graph on ``data`` with the current trained variables, in this process."""
        graph = self.loss.graph
        session = Session(graph)
        for name, value in self.variables().items():
            session.variables.load(graph.node(name), value)
        return session.run(fetches, dict(data))

    def close(self) -> None:
        """Stop the replicas (if running) and the job's parameter servers."""
        if self._closed:
            return
        self._closed = True
        # The watcher ends at its next look; waited for (not forever) so that it cannot take the cancelled tasks
        # below for lost ones and submit them again.
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join(timeout=WATCHER_JOIN_S)
        import distributed

        client, name = self.cluster.client, ps_variable(self.job_id)
        # Each step on its own, each with a deadline: the cluster may be closing too (a Ctrl-C ends both), and a
        # step that fails or does not answer must not keep the next from running.
        with contextlib.suppress(*CLOSE_ERRORS):
            call_with_deadline(lambda: client.cancel(list(self._futures)), f"cancel job {self.job_id}'s replicas")
        with contextlib.suppress(*CLOSE_ERRORS):
            if self._ps is not None:
                self._ps.close()
        with contextlib.suppress(*CLOSE_ERRORS):
            if self._addresses:
                call_with_deadline(
                    lambda: distributed.Variable(name, client=client).delete(), f"delete the Dask variable {name}"
                )
        with contextlib.suppress(*CLOSE_ERRORS):
            self.cluster.stop_parameter_servers(self.job_id)
        self._ps = None

    def __repr__(self) -> str:
        return f"<Job {self.job_id}: {self.status}, {self.replicas} replica(s), {len(self.metrics)} metrics>"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None, **_: Any) -> dict[str, Any]:
        """In a Jupyter kernel, this job's TrainingMonitor; elsewhere, a text summary of its progress."""
        # Imported here: `import cellgraph` stays free of the widget stack until something is displayed.
        from cellgraph.widgets.reprs import job_bundle

        return job_bundle(self, include, exclude)
