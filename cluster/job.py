"""``cg.train``: launch a distributed training job on a cluster, and the ``Job`` handle that follows it.

A job is three things. ``JobSpec`` (``job_spec``): everything ``cg.train`` was
asked, checked before anything starts (the cluster, every argument, the
loss, and each feed's graph, shape and dtype, with ``Session.run``'s words).
The ``Supervisor`` (``supervisor``): it starts the job's parameter servers
inside the cluster's PS workers, gives them the model, scatters one data
shard to each training worker, submits one long-lived replica task per
shard, and then watches on its own thread: lost workers and replicas
(``replica_set``, ``worker_watch``), lost servers (``ps_recovery``),
checkpoints, and the end. And ``Job``, this module's thin handle: status,
metrics, events, ``wait``, ``stop``, ``scale``, the trained variables,
``evaluate`` and ``close``. ``cg.train`` returns once the spec is
checked: the start (servers, model, replicas; a second or more) runs on the
job's own thread, so the notebook kernel stays free. The job is
``starting`` meanwhile; a start that fails fails the job with the start's
error (``job.status``, ``job.wait()``, an event in the monitor). Metrics
come back as Dask events.

A replica that fails on an error of its own (the same error would come back
wherever it ran) fails the job at once with that error, without a retry;
its traceback goes to the job's log file (``job.log_path``), which the error
names, never into the user's cells.

Examples
--------
>>> import cellgraph as cg  # doctest: +SKIP
>>> with cg.Cluster.local(workers=2, ps=1) as cluster:  # doctest: +SKIP
...     job = cg.train(loss, data=(x_train, y_train), optimizer=cg.optim.Adam(1e-2), cluster=cluster, steps=300)
...     job.wait(timeout=120)
...     trained = job.variables()
"""

from __future__ import annotations

import math
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from cellgraph.dataflow import display
from cellgraph.dataflow.errors import CellgraphError, GraphError
from cellgraph.dataflow.graph import Graph, Tensor
from cellgraph.dataflow.graphdef import computed_by
from cellgraph.dataflow.optimizers import Optimizer
from cellgraph.dataflow.placement import Placement
from cellgraph.dataflow.session import Session, feed_tensor
from cellgraph.dataflow.switch_fold import is_training_switch

from .cluster import CALL_TIMEOUT_S, Cluster
from .job_compile import compile_beside
from .job_reads import ServerReads
from .job_spec import JobSpec, PsPlacement, optimizer_config
from .job_state import JobState, Status
from .job_tasks import ps_variable, replica_stop_name, replicas_topic, stop_event_name
from .placed_training import PlacedTraining
from .ps import OptimizerConfig, ParameterClient, new_token
from .ps.config import NonFinite
from .replica import METRIC_KEYS
from .replica_set import IDLE_WORKER_WAIT_S, MAX_RESUBMITS
from .supervisor import Supervisor
from .training_graph import TrainingError, TrainingGraph

# How long wait() gives the supervisor's thread to write the final checkpoint once every replica has ended.
FINISH_JOIN_S = 30.0
# How long close() waits for a start under way to end (its calls each have a deadline: the servers' start and
# look-up, CALL_TIMEOUT_S each, then calls to the servers of at most timeout_s each) before closing what it made.
START_CALLS = 4


def train(
    loss: Tensor,
    data: Any,
    *,
    cluster: Cluster,
    optimizer: Optimizer | OptimizerConfig | None = None,
    replicas: int | None = None,
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
    overlap: bool = True,
    ps_placement: PsPlacement | None = None,
    gpu: bool | None = None,
) -> Job:
    """Train ``loss`` on ``cluster`` with ``replicas`` replicas (by default one per training worker); return the
    ``Job`` at once, while it starts.

    Everything is checked before anything starts (``JobSpec.build``): a bad
    argument, or data whose graph, shape or dtype does not fit its
    placeholder, raises ``TrainingError`` naming it, here. The start itself
    (parameter servers, the model, the replicas) runs on the job's thread:
    the job is ``starting`` until it is ``running``, and a start that fails
    makes it ``failed``, ``job.wait()`` raising the start's error.

    Parameters
    ----------
    loss
        A scalar float tensor; every trainable variable it depends on is trained.
    data
        One array per placeholder the loss needs, in the order they were made
        (``(x_train, y_train)``), or a dict ``{placeholder: array}``. Rows are
        split over the replicas in contiguous blocks, the first ``rows %
        replicas`` one row longer, so that every row is trained on. Each
        replica takes ``batch_size`` rows at a time from its block, shuffled
        at each epoch (``seed + replica``); the rows left at an epoch's end,
        fewer than a batch, wait for a later epoch's shuffle.
    cluster
        A ``cg.Cluster``; replicas run on its training workers, the
        parameter servers in its PS workers.
    replicas
        How many replicas train, each on a training worker of its own: by
        default (``None``) one per training worker the cluster has now, as
        ``%train`` does. A cluster without any training worker is refused,
        saying how many workers it has.
    mode, replicas_to_aggregate, max_staleness
        ``"sync"``: each step averages the first ``replicas_to_aggregate``
        gradients (default: all replicas; fewer leaves backup workers), all
        computed from that step's values; a later one is dropped as stale.
        As TensorFlow's ``SyncReplicasOptimizer``, a step is the *mean* of
        its gradients: for a loss that is a mean over the batch, the
        gradient of the mean over every replica's rows; a loss summed over
        the batch is divided by the number of gradients, and a weighted
        mean becomes the mean of each replica's weighted mean. With backup
        workers and several parameter servers, each server takes the first
        gradients that reach it, which may be other replicas' than another
        server took (as TensorFlow's per-variable accumulators do).
        ``"async"``: each gradient is applied on arrival, within
        ``max_staleness`` versions (such a bound needs every variable on one
        parameter server: each judges staleness by its own global step, and
        two could split a push); each server takes a schedule's rate at
        its own count of updates, which concurrent pushes may reach in
        another order on another server; pushes on their way when the
        global step reaches ``steps`` are still applied, so an async job
        may end a few steps past ``steps``.
    checkpoint_every, checkpoint_dir
        The parameter servers checkpoint at every multiple of
        ``checkpoint_every`` global steps (and the job at the end) into
        ``checkpoint_dir`` (by default a new temporary folder, which the job
        leaves for ``resume_from``), which every PS worker must reach; a lost parameter
        server costs at most that many steps. ``resume_from`` restores a
        checkpoint (a name in ``checkpoint_dir``, e.g. ``"ckpt-0000000300"``)
        first: variables, optimizer slots, Adam's step count and the global
        step (so a schedule goes on where it was); ``steps`` counts from 0,
        not from the checkpoint. Each replica goes on with the batch of the
        restored global step, so in sync mode with every replica aggregated
        (and the same data, replicas and seed) N steps, then N more resumed,
        train as 2N straight.
    nonfinite
        What a gradient holding NaN or Inf does at the parameter servers:
        ``"reject"`` (the push fails with an error naming the variable),
        ``"skip_step"`` (that step's update is dropped, the step still
        advances, and the servers count it in ``Stats.steps_skipped``) or
        ``"apply"``. With several parameter servers, the replica checks all
        its gradients and tells each server, so every server skips or refuses
        the whole step alike, never half of it.
    timeout_s
        The deadline of every call to the parameter servers, and of the wait
        for a lost one to be restarted: a server that stops answering (its
        worker killed, stopped or cut off) is back, restored, or the job has
        failed saying so, within about ``2 * timeout_s`` of when it stopped.
    ps_placement
        ``"dedicated"``: the parameter servers run in the cluster's PS workers;
        ``"colocated"``: one shard in each of the job's training workers, so
        the servers' bandwidth grows with the job. By default the cluster's
        (``Cluster.local(ps="colocated")`` makes colocated the default).
    gpu
        Where each replica computes: ``None`` (the default) on its worker's
        GPU when every training worker has one that numba.cuda sees (the ops
        with a CUDA kernel; the others on its CPU), else on its CPU; ``True``
        the GPU, refused when a training worker has none; ``False`` the CPU.
        A GPU replica sends its gradients after its backward pass.
    overlap
        Send each gradient the moment backprop computes it, while the rest is
        computed (the default); ``False`` sends them all after the backward
        pass, as a baseline to measure what the overlap saves.
    """
    if not isinstance(overlap, bool):
        raise TrainingError(f"cg.train: overlap must be True or False, got {overlap!r}")
    if gpu is not None and not isinstance(gpu, bool):
        raise TrainingError(
            f"cg.train: gpu must be True, False or None (use a GPU when every worker has one), got {gpu!r}"
        )
    spec = JobSpec.build(
        loss, data, cluster=cluster, optimizer=optimizer, replicas=replicas, batch_size=batch_size, steps=steps,
        mode=mode, replicas_to_aggregate=replicas_to_aggregate, max_staleness=max_staleness,
        checkpoint_every=checkpoint_every, checkpoint_dir=checkpoint_dir, resume_from=resume_from,
        nonfinite=nonfinite, seed=seed, metrics_interval_s=metrics_interval_s, timeout_s=timeout_s,
        ps_placement=ps_placement,
    )  # fmt: skip
    return Job(replace(spec, overlap=overlap, gpu=gpu), cluster)


class Job(ServerReads):
    """A running (or ended) training job: its status, metrics, trained variables, and controls.

    Made by ``cg.train``; do not construct it directly.
    """

    def __init__(self, spec: JobSpec, cluster: Cluster) -> None:
        job_id = f"job-{uuid.uuid4().hex[:8]}"
        folder = spec.checkpoint_dir or Path(tempfile.mkdtemp(prefix=f"cellgraph-{job_id}-"))
        self._state = JobState(
            job_id=job_id, cluster=cluster, spec=spec, checkpoint_dir=folder, token=new_token(),
            stop_name=stop_event_name(job_id), log_path=Path(tempfile.gettempdir()) / f"cellgraph-{job_id}.log",
            training=spec.training, replicas=spec.replicas,
        )  # fmt: skip
        self._supervisor = Supervisor(self._state)
        self.job_id = job_id
        self.cluster = cluster
        self.graph: TrainingGraph = spec.graph
        self.loss: Tensor = spec.loss
        # What the loss was computed from when the job started: evaluate refuses a graph a re-run cell changed since.
        self._trains = computed_by(spec.loss)
        self.steps = spec.steps
        self.replicas = spec.replicas
        self.checkpoint_every = spec.checkpoint_every
        self.checkpoint_dir = folder
        # The supervisor's lists themselves (it appends under its lock): plain attributes, as widgets read them.
        self.metrics: list[dict[str, Any]] = self._state.metrics
        self.events: list[str] = self._state.events
        self.checkpoints: list[str] = self._state.checkpoints
        """The checkpoints the job wrote that still exist (the servers' retention deletes old ones)."""
        # In the caller, as the spec's checks: a device scope the cluster cannot honour fails in cg.train itself.
        self._supervisor.place()
        cluster.on_close(job_id, self.close)
        self._closing = threading.Event()
        self._read = (0, -math.inf)  # global_step()'s last reading, and when (monotonic)
        self._state.starting = True
        self._start_thread = threading.Thread(target=self._start, name=f"cellgraph-{job_id}-start", daemon=True)
        self._start_thread.start()

    def _start(self) -> None:
        """On the job's start thread: the supervisor's start; its failure becomes the job's error and an event."""
        state = self._state
        try:
            # Beside the start: on a fresh machine the replicas' kernels compile meanwhile, once, and say so.
            compile_beside(state, self._supervisor.place().worker)
            self._supervisor.start()
        except BaseException as err:  # noqa: BLE001 - the job's error now: job.status, job.wait() and the events say it
            if self._closing.is_set():
                state.event("the job was closed while it started: nothing of it runs")
            else:
                words = str(err) if isinstance(err, CellgraphError) else f"{type(err).__name__}: {err}"
                # A scheduler lost under the start fails its calls with Dask's errors (an AttributeError of its
                # closed client among them): the cause, in words.
                words = self.cluster.scheduler_gone() or words
                state.error = TrainingError(f"job {self.job_id} could not start: {words}")
                state.event(str(state.error))
            self.cluster.forget_on_close(self.job_id)
        finally:
            state.starting = False

    def _started(self, timeout: float | None, what: str) -> None:
        """Wait (at most ``timeout`` s) for the start to end; ``TrainingError`` naming ``what`` waits if it has not."""
        self._start_thread.join(timeout)
        if self._start_thread.is_alive():
            raise TrainingError(
                f"{what}: job {self.job_id} is still starting after {timeout:g} s (its parameter servers and "
                "replicas); job.events says how far it got"
            )

    def _start_deadline(self) -> float:
        """The longest a start can take: each of its calls has a deadline."""
        return START_CALLS * max(CALL_TIMEOUT_S, self._state.spec.timeout_s)

    @property
    def placement(self) -> Placement:
        """Where every node of the job's step runs: the placement its replicas and parameter servers use.

        The step graph (``step_graph``) is the loss, its gradients and the
        optimizer's update ops; its variables, slots and updates are on the
        ``ps`` tasks (each shard holds what ``placement.ps_load_bytes()``
        says), the rest on ``/job:worker/task:0``, the worker partition every
        replica runs on its own worker.
        """
        return self._placed().placement

    @property
    def step_graph(self) -> Graph:
        """The job's whole step as one graph, which ``placement`` places (draw both with ``GraphView``)."""
        return self._placed().graph

    def _placed(self) -> PlacedTraining:
        if self._state.placed is None:
            raise TrainingError(f"job {self.job_id} has not placed its step yet: it is still starting")
        return self._state.placed

    @property
    def log_path(self) -> Path:
        """The job's log file: the traceback of a replica that failed (written only then)."""
        return self._state.log_path

    # ------------------------------------------------------------------ what it is doing
    @property
    def compiling(self) -> str:
        """While this process compiles the job's kernels (a local cluster's first job on a fresh machine): how far it
        got, e.g. ``compiling kernels 12 (conv.im2col)``; otherwise ``""``."""
        return self._state.compiling

    @property
    def status(self) -> Status:
        """``starting`` (servers and replicas being started), ``running``, ``finished``, ``failed`` or ``stopped``."""
        return self._state.status

    @property
    def abandoned(self) -> list[int]:
        """The replicas hung after the job's last step that it gave up on (their tasks cancelled), in order."""
        return sorted(self._state.abandoned)

    def metrics_frame(self) -> Any:
        """``job.metrics`` as a pandas ``DataFrame`` (one row per metrics message, ``METRIC_KEYS`` as columns)."""
        try:
            import pandas as pd
        except ImportError as err:
            raise TrainingError(
                "job.metrics_frame() needs pandas (pip install pandas); job.metrics holds the same as a list of dicts"
            ) from err
        with self._state.lock:
            rows = list(self.metrics)
        return pd.DataFrame(rows, columns=list(METRIC_KEYS))

    # ------------------------------------------------------------------ controls
    def wait(self, timeout: float | None = None) -> Job:
        """Block until every replica has ended (at most ``timeout`` s); raise the job's error if it failed (to start,
        too)."""
        state = self._state
        deadline = None if timeout is None else time.monotonic() + timeout
        self._started(timeout, "job.wait()")
        try:
            while not state.ended():
                if deadline is not None and time.monotonic() > deadline:
                    raise TrainingError(
                        f"job {self.job_id} still running after {timeout} s, at global step {state.step} of "
                        f"{self.steps} (as last seen); job.stop() ends it; job.events says what it waits for"
                    )
                time.sleep(0.05)
        except KeyboardInterrupt:
            # A notebook's interrupt ends the wait, not the job (the cluster's processes ignore it).
            raise KeyboardInterrupt(
                f"job.wait() interrupted; job {self.job_id} is still {self.status} (global step {state.step} of "
                f"{self.steps} as last seen): job.stop() ends it"
            ) from None
        thread = self._supervisor.thread
        if thread is not None:
            thread.join(timeout=FINISH_JOIN_S)
        if state.error is not None:
            raise TrainingError(str(state.error))
        if state.closed.is_set():
            # Closed (job.close(), or its cluster closing): stopped, as job.events says. Its tasks went with the
            # cluster, whose client can no longer say how they ended.
            return self
        for i, future in enumerate(state.futures):
            failure = state.failure(i)
            if failure is not None:
                raise TrainingError(f"replica {i} of job {self.job_id} failed on {failure.worker}: {failure.error}")
            if future.status in ("error", "cancelled") and i not in state.abandoned:  # abandoned: hung at the end
                raise TrainingError(f"replica {i} of job {self.job_id} failed: {future.exception()}")
        return self

    def stop(self, timeout: float = 60.0) -> Job:
        """Let each replica finish its step, then end the job with a final checkpoint.

        A job that has already ended is left as it is (a finished job stays ``finished``).
        """
        state = self._state
        self._started(timeout, "job.stop()")
        if self.status != "running":
            return self
        state.stopping = True
        state.signal_stop()
        state.event("stop asked: replicas finish their step")
        # In sync mode a replica that has pushed waits for the others' gradients, and a replica that saw the flag
        # sends none: from now on each gradient makes a step of its own, so that none waits for one that will not
        # come (until its deadline).
        state.set_replicas_to_aggregate(1, "the job is stopping")
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
        state, replica_set = self._state, self._supervisor.replicas
        self._started(timeout, f"job.scale({replicas})")
        active = state.active_replicas()
        workers = self.cluster.training_workers()
        if self.status != "running" or state.stopping:
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
        k = max(1, state.training.replicas_to_aggregate + change)
        if change < 0:
            leaving = active[change:]
            replica_set.remove(leaving, k)
            self.replicas = state.replicas = replicas
            state.event(
                f"scaled to {replicas} replica(s): replica(s) {', '.join(map(str, leaving))} leave after their step"
            )
            return self.wait_for_replicas(timeout)
        added, where = replica_set.add(change, replicas, k, workers)
        self.replicas = state.replicas = replicas
        state.event(
            f"scaled to {replicas} replica(s): replica(s) {', '.join(map(str, added))} start on {', '.join(where)}"
            + (f"; {k} gradients make a step once they have joined" if replica_set.waits_for_k else "")
        )
        return self

    def wait_for_replicas(self, timeout: float = 60.0) -> Job:
        """Block until every replica told to leave has left (at most ``timeout`` s)."""
        state = self._state
        deadline = time.monotonic() + timeout
        while not all(state.futures[i].done() for i in state.removed):
            if time.monotonic() > deadline:
                waiting = [i for i in state.removed if not state.futures[i].done()]
                raise TrainingError(
                    f"job {self.job_id}: replica(s) {', '.join(map(str, waiting))} told to leave are still running "
                    f"after {timeout} s; job.events says what they wait for"
                )
            time.sleep(0.05)
        return self

    # ------------------------------------------------------------------ results
    def evaluate(self, fetches: Any, data: Mapping[Any, Any]) -> Any:
        """Run ``fetches`` of the loss's graph on ``data`` with the current trained variables, in this process,
        as inference: every training switch (``cg.layers.training_switch()``) that ``data`` does not feed is
        False, so batch norm uses its moving statistics and dropout keeps every unit."""
        graph = self.loss.graph
        self._check_graph_unchanged(graph)
        session = Session(graph)
        for name, value in self.variables().items():
            session.variables.load(graph.node(name), value)
        feeds = dict(data)
        fed = {feed_tensor(graph, key).name for key in feeds}
        for node in graph.nodes:
            if is_training_switch(node) and node.outputs[0].name not in fed:
                feeds[node.outputs[0]] = False
        return session.run(fetches, feeds)

    def _check_graph_unchanged(self, graph: Graph) -> None:
        """A TrainingError when a re-run cell changed what the loss is computed from since the job started: the
        trained values belong to the graph as it was (with the same shapes they would be run without a word)."""
        try:
            now = computed_by(graph.tensor(self.loss.name))  # the loss's node now (a re-run re-makes it by name)
        except GraphError:
            now = {}
        changed = sorted(n for n in self._trains.keys() | now.keys() if self._trains.get(n) != now.get(n))
        if not changed:
            return
        listed = ", ".join(repr(n) for n in changed[:3]) + (", ..." if len(changed) > 3 else "")
        raise TrainingError(
            f"{self.job_id}: cannot evaluate: the graph changed since the job started ({len(changed)} node(s) of "
            f"its loss, {listed}, re-made differently or gone, as by a re-run cell), and the job's trained values "
            "belong to the graph as it was. Evaluate before changing the model, or train the new graph: "
            "job.stop(), then cg.train(...) (or %train) again"
        )

    def close(self) -> None:
        """Stop the replicas (if running) and the job's parameter servers; quiet in every state, twice too.

        A start under way is let finish first (each of its calls has a
        deadline), so that what it made is closed in order, never under it.
        """
        if self._start_thread.is_alive():
            self._closing.set()
            self._state.stopping = True  # a job closed before it trained is stopped, not finished
            self._start_thread.join(self._start_deadline())
        self._supervisor.close()
        self.cluster.forget_on_close(self.job_id)

    # Read by code written against the one-class Job (examples, benchmarks): the supervisor's state.
    @property
    def _ps(self) -> ParameterClient | None:
        return self._state.ps

    @property
    def _futures(self) -> list[Any]:
        return self._state.futures

    @property
    def _closed(self) -> bool:
        return self._state.closed.is_set()

    def __repr__(self) -> str:
        return f"<Job {self.job_id}: {self.status}, {self.replicas} replica(s), {len(self.metrics)} metrics>"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None, **_: Any) -> dict[str, Any]:
        """In a Jupyter kernel, this job's TrainingMonitor; elsewhere, a text summary of its progress."""
        return display.bundle("job", self, include, exclude)  # the widget side's, registered from above


__all__ = [
    "IDLE_WORKER_WAIT_S",
    "MAX_RESUBMITS",
    "Job",
    "JobSpec",
    "optimizer_config",
    "ps_variable",
    "replica_stop_name",
    "replicas_topic",
    "train",
]
