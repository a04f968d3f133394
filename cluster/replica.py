"""One replica of a distributed training job: pull, compute, push, until the global step is reached.

A replica is a long-lived task (a Dask task on a training worker, or a thread
in a test). It is given plain data only: a ``ReplicaSpec`` (which carries the
graph as a ``TrainingGraph``, i.e. GraphDef bytes) and its shard of the data
as NumPy arrays. It rebuilds the executor from the GraphDef, joins the job on
the parameter servers, and loops:

1. take the next ``batch_size`` rows of its shard (shuffled once per epoch;
   a replica that joins at global step ``g`` starts at batch ``g``, see
   ``_Batches``),
2. run ``[loss, *gradients]`` with the variables' values fed from the last pull,
3. push the gradients as backprop computes them, tagged with the global step
   the values came from, then pull; a ``sync`` replica asks for the values of
   the next step (``min_step=step + 1``), so it waits for the other replicas'
   gradients, an ``async`` one takes whatever the servers have now. A
   ``stale`` push (dropped by the servers) just continues with the fresh
   values. The next step starts while that pull is still arriving
   (``replica_loop.py``).

It stops when the global step reaches ``spec.steps`` or when ``stop`` is set
(after finishing its current step). Every wait is bounded by the client's
deadline (``spec.timeout_s``); errors name the replica, and the client's the
server.

Lost processes. A replica that Dask runs again (its worker died) registers
again (``Register`` is idempotent) and pulls: it goes on from the servers'
global step. A push the servers already counted (``ALREADY_EXISTS``: a retried
push, or a rerun replica's second push for a step) is not an error: the
replica pulls the next step's values instead.

Rejoining. A call that ends with a status a restore, a restart or a stop of
the servers can cause (``REJOIN_CODES``: ``ABORTED`` from a restore that woke
a waiting call, ``DEADLINE_EXCEEDED`` from a wait for a step the restored
servers will not reach in time, ``UNAVAILABLE`` from a dead shard, reported
as soon as that shard fails) makes the replica rejoin at the servers'
current global step: it asks ``locate`` (when given) for their current
addresses (a job publishes them after it restarted a lost parameter server
and restored its checkpoint; a new generation means new servers), registers
and pulls, and goes on from there. Without ``locate`` it rejoins at the same
addresses, except after ``UNAVAILABLE`` (nobody can say where the servers
went), which ends the replica. It gives up with an error naming the shard
that failed when no server answers within ``REJOIN_WAIT_FACTOR *
spec.timeout_s``, or after ``REJOIN_ATTEMPTS`` rejoins in a row with no step
between them. Metrics go to ``emit`` at most once per ``metrics_interval_s`` and at
the end; inside a Dask worker they default to the worker's event log, topic
``metrics_topic(job_id)``, which ``Client.subscribe_topic`` receives.

Examples
--------
>>> import numpy as np
>>> import cellgraph as cg
>>> from cellgraph.cluster.ps import OptimizerConfig, ParameterClient, TrainingConfig, create_server
>>> from cellgraph.cluster.replica import ReplicaSpec, run_replica
>>> from cellgraph.cluster.training_graph import prepare
>>> g = cg.Graph()
>>> with g.as_default():
...     x = cg.placeholder((None,), "float32", name="x")
...     w = cg.variable([0.0], name="w")
...     loss = cg.reduce_mean((x * w - 3.0 * x) ** 2.0)
>>> tg = prepare(loss)
>>> server, port = create_server("127.0.0.1:0", token="t0k3n")
>>> client = ParameterClient([f"127.0.0.1:{port}"], "t0k3n")
>>> client.init("fit", tg.initial, OptimizerConfig("sgd", 0.5), TrainingConfig("async"))
0
>>> spec = ReplicaSpec("fit", 0, tg, [f"127.0.0.1:{port}"], "t0k3n", mode="async", batch_size=4, steps=50)
>>> summary = run_replica(spec, [np.linspace(-1, 1, 8, dtype=np.float32)])
>>> summary["global_step"], summary["steps"]
(50, 50)
>>> round(float(client.pull().values["w"][0]), 3)  # the w that fits x * w = 3 * x
3.0
>>> client.close(); server.stop(None).wait()
True
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from cellgraph.dataflow.errors import CellgraphError
from cellgraph.dataflow.shapes import fmt

from .errors import ParameterServerError
from .ps.client import ParameterClient
from .ps.config import Mode, VariableSpec
from .ps.results import PullResult
from .replica_loop import TrainingLoop, naming
from .training_graph import LoadedGraph, TrainingError, TrainingGraph, load

# The keys of every metrics message, in the order a table would show them.
METRIC_KEYS = (
    "job",  # the job id
    "replica",  # this replica's id
    "step",  # the global step after this replica's latest push
    "loss",  # the loss of the latest batch, computed with the values pulled before it
    "examples_per_s",  # rows trained on per second since the previous message (pushes and waits included)
    "step_time_s",  # mean seconds per step since the previous message (compute, push, pull, waits)
    "staleness",  # the largest staleness of the pushes since the previous message (0 in sync mode)
    "overlap_fraction",  # mean share of each step's communication that ran while its compute ran (0 to 1)
    "ps_bytes",  # bytes of gradients pushed and values pulled by this replica so far (tensor payloads)
    "steps",  # steps this replica has done so far
    "final",  # True on the last message, sent as the replica returns
    "time",  # the replica's wall clock (time.time()) when the message was made
    # Every step's loss since the previous message: {"step": [...], "loss": [...]} (at most STEP_LOSSES of them,
    # evenly spaced, the latest always kept), so that a curve has a point per step even when messages are few.
    "step_losses",
)
# The most per-step losses one metrics message carries.
STEP_LOSSES = 256


# A replica whose servers stopped answering waits this many times its timeout for new ones: the job's own wait
# for a restarted parameter server (its timeout) plus the restore of the checkpoint.
REJOIN_WAIT_FACTOR = 2.0
# How often a replica waiting for new servers asks ``locate`` and tries to join, at most.
REJOIN_POLL_S = 0.2
# Rejoins in a row, with no step trained between them, after which a replica gives up.
REJOIN_ATTEMPTS = 5
# The deadline of each Register while a replica rejoins (at most timeout_s): a live server answers it at once, and a
# stopped one (SIGSTOP, a network cut) held each try for timeout_s, so that a replica saw the job's stop (it failed
# meanwhile) only that late.
REJOIN_TRY_S = 2.0
# The codes a restore (ABORTED, DEADLINE_EXCEEDED), a lost server (UNAVAILABLE, or CANCELLED as it goes) or a
# restarted one not yet given the job (FAILED_PRECONDITION) end a call with: the replica rejoins after them.
REJOIN_CODES = ("ABORTED", "DEADLINE_EXCEEDED", "UNAVAILABLE", "CANCELLED", "FAILED_PRECONDITION")
# Of those, the codes that need ``locate``: servers gone from their address (without it, the replica gives up).
_GONE = ("UNAVAILABLE", "CANCELLED")


def metrics_topic(job_id: str) -> str:
    """The Dask event topic a replica of ``job_id`` logs its metrics under."""
    return f"cellgraph-{job_id}"


class StopSignal(Protocol):
    """Anything with ``is_set()``: a ``threading.Event``, or a ``distributed.Event`` across processes."""

    def is_set(self) -> bool: ...


class Locator(Protocol):
    """Where the job's parameter servers are now: ``(generation, addresses)``; the generation grows at each move."""

    def __call__(self) -> tuple[int, Sequence[str]]: ...


@dataclass(frozen=True)
class ReplicaSpec:
    """What one replica needs to train, as plain data (it crosses process boundaries by value).

    Parameters
    ----------
    job_id
        The job on the parameter servers (``ParameterClient.init`` made it).
    replica_id
        This replica's id; in ``sync`` mode each id pushes at most once per step.
    graph
        The loss and its gradients (``training_graph.prepare``).
    ps_addresses
        ``host:port`` of each parameter-server shard, in shard order.
    token
        The job's token.
    mode
        ``"sync"`` or ``"async"``; must be the mode the job was initialised with.
    batch_size
        Rows per step, taken from this replica's shard.
    steps
        The global step at which the replica stops.
    seed
        Seeds the shuffle of the shard, once per epoch.
    metrics_interval_s
        The least time between two metrics messages (the last one excepted).
    timeout_s
        The deadline of every call to the parameter servers, waits included.
    """

    job_id: str
    replica_id: int
    graph: TrainingGraph = field(repr=False)
    ps_addresses: Sequence[str]
    token: str | None = field(repr=False)
    mode: Mode = "sync"
    batch_size: int = 32
    steps: int = 1000
    seed: int = 0
    metrics_interval_s: float = 1.0
    timeout_s: float = 60.0
    overlap: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "ps_addresses", tuple(self.ps_addresses))
        problems = []
        if self.mode not in ("sync", "async"):
            problems.append(f"mode {self.mode!r} is not 'sync' or 'async'")
        if not self.ps_addresses:
            problems.append("ps_addresses is empty: give the address of every parameter-server shard")
        if self.batch_size < 1:
            problems.append(f"batch_size must be at least 1, got {self.batch_size}")
        if self.steps < 0:
            problems.append(f"steps must be 0 or more, got {self.steps}")
        if not self.metrics_interval_s >= 0:
            problems.append(f"metrics_interval_s must be 0 or more, got {self.metrics_interval_s}")
        if not self.timeout_s > 0:
            problems.append(f"timeout_s must be positive, got {self.timeout_s}")
        if problems:
            raise TrainingError(f"replica {self.replica_id} of job {self.job_id!r}: " + "; ".join(problems))

    @property
    def name(self) -> str:
        """``replica 1 of job 'mnist'``: how errors and logs name this replica."""
        return f"replica {self.replica_id} of job {self.job_id!r}"


def run_replica(
    spec: ReplicaSpec,
    data: Sequence[np.ndarray],
    emit: Callable[[dict[str, Any]], None] | None = None,
    stop: StopSignal | None = None,
    locate: Locator | None = None,
) -> dict[str, Any]:
    """Train until the global step reaches ``spec.steps`` (or ``stop`` is set); return a summary.

    ``data`` holds one array per placeholder of ``spec.graph`` (same order,
    same number of rows): this replica's shard. ``emit`` receives metrics
    messages (keys ``METRIC_KEYS``); by default, inside a Dask worker task, the
    worker's event log under ``metrics_topic(spec.job_id)``, and nothing
    elsewhere. Inside a Dask task, the replica first secedes from the worker's
    thread pool, so that a long training run does not hold one of its slots.
    ``locate`` tells where the servers are after they stopped answering (see
    the module's docstring); without it, servers that stop answering end the
    replica with their ``ParameterServerError``.

    The summary has ``replica``, ``job``, ``steps`` (done by this replica),
    ``global_step``, ``loss`` (the last one, or None if no step ran),
    ``examples``, ``seconds`` (of the loop), ``setup_s`` (loading and compiling
    the graph, joining the job), ``stopped`` (whether ``stop`` ended it) and
    ``rejoins`` (how many times it joined servers at new addresses).
    """
    started = time.perf_counter()
    worker = _dask_worker()
    if worker is not None:
        import distributed

        distributed.secede()
        if emit is None:
            topic = metrics_topic(spec.job_id)
            emit = lambda msg: worker.log_event(topic, msg)
    meter = _Meter(spec, emit)
    # Its own seed (the job's plus its index) for its random ops too: replicas draw different dropout masks.
    loaded = load(spec.graph, seed=spec.seed)
    shard = _shard(spec, loaded, data)
    # One step on the initial values before joining: it compiles the kernels (so the first measured step
    # is a real one) and shows that the graph runs on this data before any server hears of this replica.
    try:
        loaded.compute(spec.graph.initial, [array[: spec.batch_size] for array in shard])
    except CellgraphError as err:
        raise TrainingError(f"{spec.name} cannot run its graph on its data: {err}") from err
    batches = _Batches(shard, spec.batch_size, spec.seed)
    link = _Link(spec, locate)
    try:
        try:
            pulled: PullResult | None = link.join()
        except ParameterServerError as err:
            pulled = link.rejoin(err, 0, stop)  # a rerun replica may start while its servers are being restarted
        loop_start = time.perf_counter()
        stopped = pulled is None or TrainingLoop(spec, loaded, batches, link, meter, stop).run(pulled)
        seconds = time.perf_counter() - loop_start
    finally:
        link.client.close()
    meter.flush(final=True)
    return {
        "replica": spec.replica_id,
        "job": spec.job_id,
        "steps": meter.total_steps,
        "global_step": meter.step,
        "loss": meter.loss,
        "examples": meter.total_steps * spec.batch_size,
        "seconds": seconds,
        "setup_s": loop_start - started,
        "stopped": stopped,
        "rejoins": link.rejoins,
    }


class _Link:
    """The replica's client of the job's parameter servers, re-opened at their new addresses when they move."""

    def __init__(self, spec: ReplicaSpec, locate: Locator | None) -> None:
        self.spec = spec
        self.locate = locate
        self.generation = 0
        self.addresses: tuple[str, ...] = tuple(spec.ps_addresses)
        self.client = ParameterClient(self.addresses, spec.token, timeout=spec.timeout_s)
        self.rejoins = 0
        self.rejoins_in_row = 0  # since the last step trained: bounded by REJOIN_ATTEMPTS

    def join(self, register_timeout: float | None = None) -> PullResult:
        """Register with the servers (within ``register_timeout``, by default ``timeout_s``), check they hold this
        graph's job, and pull every variable."""
        spec = self.spec
        with naming(spec, "joining the job"):
            info = self.client.register(spec.replica_id, timeout=register_timeout)
            _check_job(spec, {name: pieces[0][1] for name, pieces in info.layout.items()}, info.training.mode)
            return self.client.pull(spec.graph.pulled, replica_id=spec.replica_id)

    def rejoin(self, err: ParameterServerError, step: int, stop: StopSignal | None) -> PullResult | None:
        """After ``err`` from servers that were restored, restarted or lost: join them, or their successors.

        Returns what the join pulled (the servers' current global step and
        values), or None if ``stop`` was set meanwhile; re-raises ``err`` when
        its code is not one of ``REJOIN_CODES``, or is UNAVAILABLE with no
        ``locate``; raises a ``ParameterServerError`` naming the shard that
        failed when none answers within ``REJOIN_WAIT_FACTOR * timeout_s``,
        or after ``REJOIN_ATTEMPTS`` rejoins with no step between them.
        """
        if err.code not in REJOIN_CODES or (self.locate is None and err.code in _GONE):
            raise err
        spec = self.spec
        self.rejoins_in_row += 1
        if self.rejoins_in_row > REJOIN_ATTEMPTS:
            raise ParameterServerError(
                f"{spec.name}: rejoined the parameter server(s) {', '.join(self.addresses)} {REJOIN_ATTEMPTS} times "
                f"in a row without training a step (global step {step}); last error: {err}. The replica gives up, "
                "and the job fails with it (Dask never runs a replica task again)",
                err.code,
            ) from err
        wait = REJOIN_WAIT_FACTOR * spec.timeout_s
        lost, last = time.monotonic(), err
        while time.monotonic() - lost < wait:
            if stop is not None and stop.is_set():
                return None
            if self.locate is not None:
                try:
                    generation, addresses = self.locate()
                except Exception as problem:  # the scheduler busy, or nothing published: ask again
                    last = ParameterServerError(f"{spec.name} could not learn the servers' addresses: {problem}")
                else:
                    if generation != self.generation:
                        self.client.close()
                        self.generation, self.addresses = generation, tuple(addresses)
                        self.client = ParameterClient(self.addresses, spec.token, timeout=spec.timeout_s)
            try:
                pulled = self.join(min(spec.timeout_s, REJOIN_TRY_S))
            except ParameterServerError as failed:
                if failed.code not in REJOIN_CODES:
                    raise
                last = failed
            else:
                self.rejoins += 1
                return pulled
            time.sleep(REJOIN_POLL_S)
        raise ParameterServerError(
            f"{spec.name}: parameter server(s) {', '.join(self.addresses)} stopped answering at global step {step}, "
            f"and none answered in the {wait:g} s since (generation {self.generation} of the job's addresses); "
            f"last error: {last}. The replica gives up, and the job fails with it (Dask never runs a replica task "
            "again)",
            "UNAVAILABLE",
        ) from err


def _dask_worker() -> Any:
    """The Dask worker running this task, or None outside one."""
    try:
        from distributed import get_worker
    except ImportError:  # pragma: no cover - distributed is a dependency
        return None
    try:
        return get_worker()
    except ValueError:  # "No worker found": not inside a task
        return None


def _check_job(spec: ReplicaSpec, held: dict[str, VariableSpec], mode: str) -> None:
    missing = [name for name in spec.graph.held if name not in held]
    if missing:
        raise TrainingError(
            f"{spec.name}: the parameter servers hold no variable(s) {', '.join(map(repr, missing))}; "
            "initialise the job with this graph's TrainingGraph.initial"
        )
    for name in spec.graph.held:
        mine, theirs = spec.graph.initial[name], held[name]
        # Sizes, not shapes: the parameter service holds a 0-d variable as shape (1,).
        if theirs.dtype != mine.dtype or math.prod(theirs.whole_shape) != mine.size:
            raise TrainingError(
                f"{spec.name}: the parameter servers hold '{name}' as {fmt(theirs.whole_shape)} {theirs.dtype}, "
                f"but this graph's is {fmt(mine.shape)} {mine.dtype}; was the job initialised with another graph?"
            )
    if mode != spec.mode:
        raise TrainingError(
            f"{spec.name} was started in {spec.mode} mode, but the parameter servers run the job in {mode} "
            "mode; start the replicas with the job's mode"
        )


def _shard(spec: ReplicaSpec, loaded: LoadedGraph, data: Sequence[np.ndarray]) -> list[np.ndarray]:
    try:
        arrays = loaded.convert(data)
    except TrainingError as err:
        raise TrainingError(f"{spec.name}: {err}") from None
    rows = len(arrays[0]) if arrays and arrays[0].ndim else 0
    if arrays and rows < spec.batch_size:
        raise TrainingError(
            f"{spec.name}: its shard has {rows} row(s), fewer than batch_size {spec.batch_size}; "
            "use a smaller batch_size or fewer replicas"
        )
    return arrays


class _Batches:
    """Batch ``i`` of a replica's stream: consecutive ``batch_size`` rows of its shard, in epoch ``e``'s order.

    Epoch ``e`` orders the shard by ``np.random.default_rng([seed, e]).permutation(rows)``
    and holds ``rows // batch_size`` batches; the rows left at its end (fewer
    than a batch) are skipped in that epoch, so every batch has the same shape
    (and the compiled plan never changes), and come in a later epoch's order.
    Because an epoch's order depends on its number alone, ``seek(i)`` costs
    nothing: a replica that joins at global step ``i`` (a job resumed from a
    checkpoint, servers restored, a replica run again) starts at batch ``i``,
    where a sync run that never stopped would be, rather than at its shard's
    first batch again. A batch is a view of its epoch's shuffled copy.
    """

    def __init__(self, arrays: list[np.ndarray], batch_size: int, seed: int) -> None:
        self.arrays = arrays
        self.batch_size = batch_size
        self.seed = seed
        rows = len(arrays[0]) if arrays else 0
        self.per_epoch = max(1, rows // batch_size)
        self.index = 0  # the batch next() gives
        self.epoch_number = -1  # the epoch whose shuffled copy ``epoch`` holds
        self.epoch: list[np.ndarray] = []

    def seek(self, index: int) -> None:
        """Make batch ``index`` the next one."""
        self.index = index

    def next(self) -> list[np.ndarray]:
        if not self.arrays:
            return []
        number, within = divmod(self.index, self.per_epoch)
        if number != self.epoch_number:
            order = np.random.default_rng([self.seed, number]).permutation(len(self.arrays[0]))
            self.epoch, self.epoch_number = [array[order] for array in self.arrays], number
        self.index += 1
        start = within * self.batch_size
        return [array[start : start + self.batch_size] for array in self.epoch]


_RATE_KEYS = ("examples_per_s", "step_time_s", "staleness", "overlap_fraction")


def _step_losses(points: list[tuple[int, float]]) -> dict[str, list[float]]:
    """``points`` as columns, at most ``STEP_LOSSES`` of them, evenly spaced, the latest always kept."""
    if len(points) > STEP_LOSSES:
        last = len(points) - 1
        points = [points[round(i * last / (STEP_LOSSES - 1))] for i in range(STEP_LOSSES)]
    return {"step": [float(s) for s, _ in points], "loss": [float(v) for _, v in points]}


class _Meter:
    """Counts steps and sends a metrics message at most once per interval (and one at the end)."""

    def __init__(self, spec: ReplicaSpec, emit: Callable[[dict[str, Any]], None] | None) -> None:
        self.spec = spec
        self.emit = emit
        self.total_steps = 0
        self.step = 0
        self.loss: float | None = None
        self.last_emit = -math.inf  # the first step is reported at once
        self.window_start = time.perf_counter()
        self.last_message: dict[str, Any] | None = None
        self.ps_bytes = 0
        self._reset_window()

    def start(self, step: int) -> None:
        """The loop begins at global step ``step``: rates count from now."""
        self.step = step
        self.window_start = time.perf_counter()

    def _reset_window(self) -> None:
        self.window_steps = 0
        self.window_time = 0.0
        self.window_staleness = 0
        self.window_overlap = 0.0
        self.window_losses: list[tuple[int, float]] = []

    def record(
        self, step: int, loss: float, seconds: float, staleness: int, ps_bytes: int = 0, overlap: float = 0.0
    ) -> None:
        self.total_steps += 1
        self.ps_bytes += ps_bytes
        self.step, self.loss = step, loss
        self.window_steps += 1
        self.window_time += seconds
        self.window_staleness = max(self.window_staleness, staleness)
        self.window_overlap += overlap
        self.window_losses.append((step, loss))
        if time.perf_counter() - self.last_emit >= self.spec.metrics_interval_s:
            self.flush()

    def flush(self, final: bool = False) -> None:
        if self.emit is None or self.loss is None:
            return
        now = time.perf_counter()
        if self.window_steps:
            elapsed = now - (self.window_start if self.last_emit == -math.inf else self.last_emit)
            rates = {
                "examples_per_s": self.window_steps * self.spec.batch_size / max(elapsed, 1e-9),
                "step_time_s": self.window_time / self.window_steps,
                "staleness": self.window_staleness,
                "overlap_fraction": self.window_overlap / self.window_steps,
            }
        elif final and self.last_message is not None:
            # Nothing new since the last message: the end repeats its rates rather than reporting zeros.
            rates = {key: self.last_message[key] for key in _RATE_KEYS}
        else:
            return
        message = {
            "job": self.spec.job_id,
            "replica": self.spec.replica_id,
            "step": self.step,
            "loss": self.loss,
            **rates,
            "ps_bytes": self.ps_bytes,
            "steps": self.total_steps,
            "final": final,
            "time": time.time(),
            "step_losses": _step_losses(self.window_losses),
        }
        self.emit(message)
        self.last_message, self.last_emit = message, now
        self._reset_window()


__all__ = ["METRIC_KEYS", "Locator", "ReplicaSpec", "StopSignal", "metrics_topic", "run_replica"]
