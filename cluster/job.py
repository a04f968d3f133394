"""``cg.train``: launch a distributed training job on a cluster, and the ``Job`` that follows it.

``train`` checks everything it can before starting anything (the cluster, the
replicas, the data, the batch size, the loss), then starts the job's
parameter servers inside the cluster's PS workers, gives them the model,
scatters one data shard to each training worker, and submits one long-lived
replica task per shard. It returns at once: the notebook kernel stays free.
Metrics come back as Dask events; the ``Job`` collects them.

Examples
--------
>>> import cellgraph as cg  # doctest: +SKIP
>>> with cg.Cluster.local(workers=2, ps=1) as cluster:  # doctest: +SKIP
...     job = cg.train(loss, data=(x_train, y_train), optimizer=cg.optim.Adam(1e-2), cluster=cluster, steps=300)
...     job.wait(timeout=120)
...     trained = job.variables()
"""

from __future__ import annotations

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

from .cluster import Cluster, ClusterError
from .errors import ParameterServerError
from .ps import OptimizerConfig, ParameterClient, TrainingConfig, new_token
from .replica import ReplicaSpec, metrics_topic, run_replica
from .training_graph import TrainingError, TrainingGraph, prepare

Status = Literal["running", "finished", "failed", "stopped"]
# How often a replica looks at the job's stop flag (a call to the scheduler), at most.
STOP_POLL_S = 0.25
# How often the job looks at the parameter servers' step, to checkpoint and to notice the end.
WATCH_S = 0.2


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
    """A ``distributed.Event`` read at most every ``STOP_POLL_S``: each read is a call to the scheduler."""

    def __init__(self, name: str) -> None:
        import distributed

        self._event = distributed.Event(name)
        self._checked = 0.0
        self._set = False

    def is_set(self) -> bool:
        now = time.monotonic()
        if not self._set and now - self._checked >= STOP_POLL_S:
            self._checked = now
            self._set = bool(self._event.is_set())
        return self._set


def _replica_task(spec: ReplicaSpec, data: Sequence[np.ndarray], stop_event: str) -> dict[str, Any]:
    """What runs on a training worker: one replica, until the job's last step or its stop flag."""
    return run_replica(spec, data, stop=_ThrottledEvent(stop_event))


def _arrays_for(tg: TrainingGraph, data: Any) -> list[np.ndarray]:
    """``data`` as one array per placeholder of ``tg``, in ``tg.placeholders`` order."""
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
        return [np.asarray(by_name[p]) for p in wanted]
    if isinstance(data, (tuple, list)):
        if len(data) != len(wanted):
            raise TrainingError(
                f"data has {len(data)} array(s) but the loss needs {len(wanted)} placeholder(s) "
                f"({', '.join(map(repr, wanted))}): give one array per placeholder, in that order, "
                "or a dict {placeholder: array}"
            )
        return [np.asarray(a) for a in data]
    raise TrainingError(f"data must be a tuple of arrays or a dict {{placeholder: array}}, got {type(data).__name__}")


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
        Save every so many global steps (and at the end) into
        ``checkpoint_dir`` (a temporary folder by default), which every PS
        worker must reach. ``resume_from`` restores a checkpoint first.
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
    if problems:
        raise TrainingError("cg.train: " + "; ".join(problems))
    config = optimizer_config(optimizer)
    tg = prepare(loss)
    arrays = _arrays_for(tg, data)
    rows = {p: len(a) if a.ndim else 0 for p, a in zip(tg.placeholders, arrays)}
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
    training = TrainingConfig(mode, k if mode == "sync" else 1, max_staleness)
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

    # ------------------------------------------------------------------ starting
    @classmethod
    def _start(
        cls,
        cluster: Cluster,
        tg: TrainingGraph,
        arrays: list[np.ndarray],
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
        client = cluster.client
        addresses = cluster.start_parameter_servers(job.job_id, token, job.checkpoint_dir)
        try:
            job._ps = ParameterClient(addresses, token, timeout=timeout_s)
            job._ps.init(job.job_id, tg.initial, optimizer, training)
            if resume_from:
                step = job._ps.restore(resume_from)
                job._event(f"resumed from checkpoint {resume_from} at global step {step}")
            client.subscribe_topic(metrics_topic(job.job_id), job._on_metrics)
            job._stop_name = f"cellgraph-stop-{job.job_id}"
            distributed.Event(job._stop_name, client=client).clear()
            workers = cluster.training_workers()[:replicas]
            per = len(arrays[0]) // replicas
            for i, worker in enumerate(workers):
                shard = [a[i * per : (i + 1) * per] for a in arrays]
                held = client.scatter(shard, workers=[worker], hash=False)
                spec = ReplicaSpec(
                    job.job_id, i, tg, addresses, token, training.mode, batch_size, steps,
                    seed + i, metrics_interval_s, timeout_s,
                )  # fmt: skip
                job._futures.append(
                    client.submit(
                        _replica_task,
                        spec,
                        held,
                        job._stop_name,
                        key=f"cellgraph-replica-{job.job_id}-{i}",
                        workers=[worker],
                        allow_other_workers=True,
                        pure=False,
                        retries=3,
                    )  # fmt: skip
                )
        except BaseException:
            job.close()
            raise
        job._event(
            f"started {replicas} replica(s) in {training.mode} mode on {', '.join(workers)}; PS at {', '.join(addresses)}"
        )
        job._watcher = threading.Thread(target=job._watch, name=f"cellgraph-{job.job_id}-watch", daemon=True)
        job._watcher.start()
        return job

    # ------------------------------------------------------------------ what comes back
    def _on_metrics(self, event: tuple[float, dict[str, Any]]) -> None:
        _, message = event
        with self._lock:
            self.metrics.append(dict(message))

    def _event(self, text: str) -> None:
        with self._lock:
            self.events.append(f"{time.strftime('%H:%M:%S')} {text}")

    def _watch(self) -> None:
        """Checkpoint every ``checkpoint_every`` steps; notice when the replicas end."""
        saved_at = 0
        while not self._closed:
            done = all(f.done() for f in self._futures)
            try:
                step = self.global_step()
            except CellgraphError as err:
                if not done:
                    self._event(f"could not read the global step: {err}")
                step = saved_at
            if self.checkpoint_every and step - saved_at >= self.checkpoint_every and not done:
                saved_at = step - step % self.checkpoint_every
                self._save(f"every {self.checkpoint_every} steps")
            if done:
                self._finish()
                return
            time.sleep(WATCH_S)

    def _finish(self) -> None:
        failed = [f for f in self._futures if f.status == "error"]
        if failed:
            self._error = failed[0].exception()
            self._event(f"replica {self._futures.index(failed[0])} failed: {self._error}")
            return
        self._save("final")
        self._event(f"{'stopped' if self._stopping else 'finished'} at global step {self.global_step()}")

    def _save(self, why: str) -> None:
        if self._ps is None:
            return
        try:
            name = self._ps.save()
        except CellgraphError as err:
            self._event(f"checkpoint ({why}) failed: {err}")
            return
        with self._lock:
            self.checkpoints.append(name)
        self._event(f"checkpoint {name} written ({why}) in {self.checkpoint_dir}")

    # ------------------------------------------------------------------ the public handle
    @property
    def status(self) -> Status:
        if self._error is not None or any(f.status == "error" for f in self._futures):
            return "failed"
        if not all(f.done() for f in self._futures):
            return "running"
        return "stopped" if self._stopping else "finished"

    def global_step(self) -> int:
        """The parameter servers' global step (the lowest over the shards)."""
        if self._ps is None:
            raise TrainingError(f"job {self.job_id} has no parameter servers")
        return min(s.global_step for s in self._ps.stats())

    def wait(self, timeout: float | None = None) -> Job:
        """Block until every replica has ended (at most ``timeout`` s); raise the first replica's error."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not all(f.done() for f in self._futures):
            if deadline is not None and time.monotonic() > deadline:
                raise TrainingError(
                    f"job {self.job_id} still running after {timeout} s, at global step {self.global_step()} of "
                    f"{self.steps}; job.stop() ends it"
                )
            time.sleep(0.05)
        if self._watcher is not None:
            self._watcher.join(timeout=30)
        for i, future in enumerate(self._futures):
            if future.status == "error":
                raise TrainingError(f"replica {i} of job {self.job_id} failed: {future.exception()}")
        return self

    def stop(self, timeout: float = 60.0) -> Job:
        """Let each replica finish its step, then end the job with a final checkpoint."""
        import distributed

        self._stopping = True
        distributed.Event(self._stop_name, client=self.cluster.client).set()
        self._event("stop asked: replicas finish their step")
        return self.wait(timeout)

    def variables(self) -> dict[str, np.ndarray]:
        """The trained values of every variable, from the parameter servers."""
        if self._ps is None:
            raise TrainingError(f"job {self.job_id} is closed: its parameter servers are gone")
        return self._ps.pull().values

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
        try:
            for future in self._futures:
                future.cancel()
            if self._ps is not None:
                self._ps.close()
            self.cluster.stop_parameter_servers(self.job_id)
        except (ClusterError, ParameterServerError, AttributeError):
            pass  # the cluster may be closing too; nothing of the job is left to stop
        self._ps = None

    def __repr__(self) -> str:
        return f"<Job {self.job_id}: {self.status}, {self.replicas} replica(s), {len(self.metrics)} metrics>"
