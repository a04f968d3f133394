"""A distributed training run of a digits model, as ``cellgraph demo`` and ``cellgraph train`` do it.

``run`` starts (or joins) a Dask cluster, launches ``cg.train``, follows the
job with a progress bar fed by the job's metrics, evaluates on the test
split, and closes the job and the cluster whatever happens (an error, a
Ctrl-C). It prints as it goes and returns an ``Outcome``.

Examples
--------
>>> from cellgraph.examples.distributed import Settings, run  # doctest: +SKIP
>>> outcome = run(Settings(model="mlp", steps=200, progress=False))  # doctest: +SKIP
>>> outcome.test_accuracy >= outcome.target  # doctest: +SKIP
True
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import cellgraph as cg
from cellgraph.cluster.cluster import Cluster
from cellgraph.cluster.job import Job, train
from cellgraph.dataflow.errors import CellgraphError
from cellgraph.dataflow.optimizer_registry import OPTIMIZER_KINDS
from cellgraph.dataflow.optimizers import optimizer_class

from . import digits, models
from .progress import progress_bar

# Per model: global steps and Adam learning rate that reach its target in sync mode with 2 replicas of
# batch 64 (measured: the MLP 99.2% in 200 steps, the mini-Inception 98.9% in 400 steps, ~36 epochs).
# The transformer 98.05% in 400 steps, the LSTM 97.49% in 600. The batch-normalized models (resnet,
# inception_v3) do not train on the cluster yet: their steps assign the moving statistics, and the
# placed step (cluster/placed_training.py) puts those variables on the parameter servers and cannot.
DEFAULT_STEPS = {"mlp": 200, "inception": 400, "resnet": 400, "inception_v3": 400, "transformer": 400, "lstm": 600}
DEFAULT_LR = {"mlp": 1e-2, "inception": 3e-3, "resnet": 3e-3, "inception_v3": 3e-3, "transformer": 3e-3, "lstm": 1e-2}
TARGETS = {"mlp": 0.97, "inception": 0.98, "resnet": 0.97, "inception_v3": 0.97, "transformer": 0.97, "lstm": 0.97}
# How often the progress bar asks the parameter servers for the global step.
POLL_S = 0.25
# Seconds a job that ran past its timeout gets to stop cleanly before it is closed.
STOP_S = 10.0
# Seconds to reach a scheduler given by address before saying it cannot be reached.
CONNECT_TIMEOUT_S = 5.0


class SetupError(CellgraphError):
    """The run could not start: settings that do not fit the data or the cluster, or an unreachable scheduler."""


@dataclass(frozen=True)
class Settings:
    """What to train and where; ``None`` means the model's default (steps, lr) or every training worker (replicas)."""

    model: str = "inception"
    workers: int = 2
    ps: int = 1
    mode: Literal["sync", "async"] = "sync"
    steps: int | None = None
    batch_size: int = 64
    replicas: int | None = None
    replicas_to_aggregate: int | None = None
    optimizer: str = "adam"  # a kind of the optimizer registry
    lr: float | None = None
    checkpoint_dir: str | None = None
    scheduler: str | None = None
    progress: bool = True
    timeout_s: float = 600.0


@dataclass(frozen=True)
class Outcome:
    """What a run measured; ``examples`` counts the rows of every gradient the parameter servers applied."""

    model: str
    steps: int
    seconds: float
    examples: int
    test_accuracy: float
    target: float
    bytes_in: int
    bytes_out: int
    checkpoint: str | None

    @property
    def met(self) -> bool:
        return self.test_accuracy >= self.target

    @property
    def examples_per_s(self) -> float:
        return self.examples / max(self.seconds, 1e-9)


def run(settings: Settings, say: Callable[[str], None] = print) -> Outcome:
    """Train ``settings.model`` on the digits on a cluster; close everything before returning or raising."""
    data = digits.load()
    model = models.MODELS[settings.model](optimizer=optimizer_for(settings))
    x_train = data.images(data.x_train) if model.image_input else data.x_train
    x_test = data.images(data.x_test) if model.image_input else data.x_test
    started = time.perf_counter()
    cluster = _open_cluster(settings)
    job: Job | None = None
    try:
        replicas = settings.replicas or len(cluster.training_workers())
        say(f"cluster: {_describe(cluster)}, ready in {time.perf_counter() - started:.1f} s")
        steps = settings.steps or DEFAULT_STEPS[settings.model]
        try:
            job = train(
                model.loss, (x_train, data.y_train), cluster=cluster, optimizer=optimizer_for(settings),
                replicas=replicas, batch_size=settings.batch_size, steps=steps, mode=settings.mode,
                replicas_to_aggregate=settings.replicas_to_aggregate, checkpoint_dir=settings.checkpoint_dir,
                metrics_interval_s=0.5,
            )  # fmt: skip
        except CellgraphError as err:
            raise SetupError(str(err)) from err
        say(
            f"job {job.job_id}: {model.name}, {steps} steps in {settings.mode} mode, {replicas} replica(s) "
            f"of batch {settings.batch_size}, {type(optimizer_for(settings)).__name__}({_lr(settings):g})"
        )
        began = time.perf_counter()
        _follow(job, model.name, settings)
        seconds = time.perf_counter() - began
        accuracy = float(job.evaluate(model.accuracy, model.eval_feeds(x_test, data.y_test)))
        assert job._ps is not None  # open until job.close() below
        stats = job._ps.stats()  # a public Job accessor for the servers' Stats is asked for
        checkpoint = str(Path(job.checkpoint_dir) / job.checkpoints[-1]) if job.checkpoints else None
        outcome = Outcome(
            model.name, job.global_step(), seconds, stats[0].pushes_applied * settings.batch_size, accuracy,
            TARGETS[settings.model], sum(s.bytes_in for s in stats), sum(s.bytes_out for s in stats), checkpoint,
        )  # fmt: skip
    finally:
        closing = time.perf_counter()
        try:
            if job is not None:
                job.close()
        finally:
            cluster.close()
        shutdown_s = time.perf_counter() - closing
    met = "met" if outcome.met else "NOT met"
    say(f"{outcome.model}: test accuracy {outcome.test_accuracy:.2%} (target {outcome.target:.0%}, {met})")
    say(_summary(outcome, settings, replicas, len(stats), shutdown_s))
    return outcome


def _lr(settings: Settings) -> float:
    if settings.lr is not None:
        return settings.lr
    if settings.optimizer == "adam":
        return DEFAULT_LR[settings.model]  # tuned for Adam
    return float(OPTIMIZER_KINDS.lookup(settings.optimizer).defaults()["learning_rate"])


def optimizer_for(settings: Settings) -> cg.optim.Optimizer:
    """The graph optimizer ``settings`` name: its kind, with ``settings.lr`` or the default rate."""
    return optimizer_class(settings.optimizer)(_lr(settings))


def _open_cluster(settings: Settings) -> Cluster:
    """A local cluster (its processes ignore the terminal's Ctrl-C: this process closes them), or a joined one."""
    if settings.scheduler is None:
        with _sigint_ignored_by_children():
            return Cluster.local(workers=settings.workers, ps=settings.ps)
    try:
        cluster = Cluster.connect(settings.scheduler, timeout=CONNECT_TIMEOUT_S)
    except CellgraphError as err:
        raise SetupError(str(err)) from err
    try:
        if not cluster.ps_workers():
            cluster.assign(ps=settings.ps)  # no worker carries the Dask resource 'ps': the first ones serve
    except BaseException as err:
        cluster.close()
        if isinstance(err, CellgraphError):
            raise SetupError(f"the cluster at {settings.scheduler}: {err}") from err
        raise
    return cluster


@contextlib.contextmanager
def _sigint_ignored_by_children() -> Iterator[None]:
    """Ctrl-C in a terminal signals the whole process group; worker processes started meanwhile inherit
    SIG_IGN, so only this process hears it and shuts them down in order. A Ctrl-C during start-up is lost."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _describe(cluster: Cluster) -> str:
    ps, workers = cluster.ps_workers(), cluster.training_workers()
    return f"{cluster.kind} at {cluster.scheduler_address}, {len(ps)} PS + {len(workers)} training worker(s)"


def _follow(job: Job, label: str, settings: Settings) -> None:
    """Refresh the progress bar from the job until it ends; stop it and raise at ``settings.timeout_s``."""
    bar = _bar(job.steps, f"training {label}") if settings.progress else None
    deadline = time.monotonic() + settings.timeout_s
    try:
        while job.status in ("starting", "running"):  # cg.train returns while the job starts
            if time.monotonic() > deadline:
                step = _step(job)
                # A clean stop writes a final checkpoint; if it does not come in time, close() ends the job anyway.
                with contextlib.suppress(CellgraphError):
                    job.stop(timeout=STOP_S)
                raise CellgraphError(
                    f"job {job.job_id} did not finish within {settings.timeout_s:g} s (global step {step} of "
                    f"{job.steps}): use fewer steps or a longer timeout; its checkpoints are in {job.checkpoint_dir}"
                )
            if bar is not None:
                bar.update(max(0, min(_step(job), job.steps) - bar.n))
                # A first run on a machine: how far the kernels' compile got (``compiling kernels 12 (...)``).
                bar.set_postfix_str(job.compiling or _postfix(job.metrics), refresh=False)
                bar.refresh()
            time.sleep(POLL_S)
        job.wait(timeout=60)  # raises a replica's error; lets the final checkpoint be written
        if bar is not None:
            bar.update(max(0, job.steps - bar.n))
            bar.set_postfix_str(_postfix(job.metrics))
    finally:
        if bar is not None:
            bar.close()


def _step(job: Job) -> int:
    """The global step; from the metrics when the parameter servers do not answer (the bar must not stop)."""
    try:
        return int(job.global_step())
    except CellgraphError:
        return max((int(m["step"]) for m in job.metrics), default=0)


def _postfix(metrics: list[dict[str, Any]]) -> str:
    """The latest loss (mean over replicas) and examples/s (sum over replicas) of the metrics so far."""
    latest = {m["replica"]: m for m in list(metrics)}
    if not latest:
        # The first run on a machine compiles every kernel in each worker (cached on disk from then on).
        return "replicas starting (a first run compiles the kernels: about a minute)"
    loss = sum(float(m["loss"]) for m in latest.values()) / len(latest)
    rate = sum(float(m["examples_per_s"]) for m in latest.values())
    return f"loss={loss:.4f}, examples/s={rate:,.0f}"


def _bar(total: int, label: str) -> Any:
    return progress_bar(total, label)


def _summary(outcome: Outcome, settings: Settings, replicas: int, shards: int, shutdown_s: float) -> str:
    if settings.mode == "sync":
        k = settings.replicas_to_aggregate or replicas
        how = f"sync mode, each step averaging {k} of {replicas} replicas' gradients of batch {settings.batch_size}"
    else:
        how = f"async mode, {replicas} replicas of batch {settings.batch_size} each applying on arrival"
    saved = f"final checkpoint {outcome.checkpoint}" if outcome.checkpoint else "no checkpoint written"
    closed = (
        f"job and cluster shut down in {shutdown_s:.1f} s"
        if settings.scheduler is None
        else f"job closed in {shutdown_s:.1f} s; the cluster at {settings.scheduler} is left running "
        "(this command did not start it)"
    )
    return (
        f"Summary: {outcome.steps} global steps of {outcome.model} ({how}) in {outcome.seconds:.1f} s, "
        f"{outcome.examples:,} examples applied ({outcome.examples_per_s:,.0f} examples/s); the parameter servers "
        f"({shards} shard(s)) received {outcome.bytes_in / 1e6:.1f} MB and sent {outcome.bytes_out / 1e6:.1f} MB; "
        f"{saved}; {closed}."
    )
