"""What ``cg.train`` was asked to do, checked whole before anything starts: a ``JobSpec``.

``JobSpec.build`` takes ``cg.train``'s arguments and either returns a spec
that a job can run as given, or raises ``TrainingError`` naming every
argument that is wrong (one message, ``cg.train: ...; ...``) and what to pass
instead. Nothing is started meanwhile: no parameter server, no task, no
Dask event. The data is checked like ``Session.run`` checks its feeds (the
same rule and the same words, from ``dataflow.session``): each array belongs
to a placeholder of the loss's graph, and a batch of it has a shape and a
dtype that placeholder takes. So a mistake that would fail on every replica,
on a worker, fails here, in the user's cell.

Examples
--------
>>> import numpy as np
>>> import cellgraph as cg
>>> from cellgraph.cluster.job_spec import optimizer_config
>>> optimizer_config(cg.optim.Momentum(0.1, momentum=0.5))
OptimizerConfig(kind='momentum', learning_rate=0.1, momentum=0.5, nesterov=False)
"""

from __future__ import annotations

import math
import numbers
import os
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from cellgraph.dataflow.cells import CellgraphWarning
from cellgraph.dataflow.dtypes import outside_int_range, past_float_range
from cellgraph.dataflow.errors import CellgraphError
from cellgraph.dataflow.graph import Graph, Tensor
from cellgraph.dataflow.mixed_precision import MixedPrecision
from cellgraph.dataflow.optimizers import CLASSES, Optimizer
from cellgraph.dataflow.session import convert_feed

from .cluster import Cluster
from .errors import ParameterServerError
from .ps import OptimizerConfig, TrainingConfig
from .ps.config import NONFINITE, NonFinite
from .ps.shard_layout import TRAINABLE
from .training_graph import TrainingError, TrainingGraph, prepare

# Where a job's parameter servers run: the cluster's PS workers, or one shard in each of its training workers.
PsPlacement = Literal["dedicated", "colocated"]

Mode = Literal["sync", "async"]


@dataclass(frozen=True)
class JobSpec:
    """A training job as ``cg.train`` was asked for it, every value checked (``JobSpec.build``).

    ``arrays`` holds one array per placeholder of ``graph``, in
    ``graph.placeholders`` order: NumPy arrays, or ``dask.array`` arrays with
    known rows (computed on the workers, never in this process).
    """

    loss: Tensor = field(repr=False)
    graph: TrainingGraph = field(repr=False)
    arrays: tuple[Any, ...] = field(repr=False)
    optimizer: OptimizerConfig
    training: TrainingConfig
    replicas: int
    batch_size: int
    steps: int
    checkpoint_every: int | None
    checkpoint_dir: Path | None
    resume_from: str | None
    seed: int
    metrics_interval_s: float
    timeout_s: float
    overlap: bool = True  # gradients sent while backprop goes on (cg.train's ``overlap``)
    ps_placement: PsPlacement = "dedicated"  # the PS workers, or a shard in each of the job's training workers
    gpu: bool | None = None  # replicas on their workers' GPUs: None when every training worker has one (cg.train's)

    @property
    def rows(self) -> int:
        """Rows of the data (every array has as many)."""
        return rows_of(self.arrays[0])

    @classmethod
    def build(
        cls,
        loss: Tensor,
        data: Any,
        *,
        cluster: Cluster,
        optimizer: Optimizer | OptimizerConfig | None,
        replicas: int | None,
        batch_size: int,
        steps: int,
        mode: Mode,
        replicas_to_aggregate: int | None,
        max_staleness: int | None,
        checkpoint_every: int | None,
        checkpoint_dir: str | os.PathLike[str] | None,
        resume_from: str | None,
        nonfinite: NonFinite,
        seed: int,
        metrics_interval_s: float,
        timeout_s: float,
        ps_placement: PsPlacement | None = None,
    ) -> JobSpec:
        """The spec of ``cg.train(loss, data, ...)``; ``TrainingError`` naming every bad argument."""
        if not isinstance(cluster, Cluster) or cluster.closed:
            raise TrainingError(
                "cg.train needs an open cluster: cluster=cg.Cluster.local() (or Cluster.connect(address))"
            )
        workers = cluster.training_workers()
        if not workers and (replicas is None or (_is_int(replicas) and replicas >= 1)):
            # Not "pass replicas=0" (as before): no number of replicas can train there.
            raise TrainingError(f"cg.train: {no_training_worker(cluster, replicas)}")
        if replicas is None:
            replicas = len(workers)  # the default: one per training worker, as %train
        problems = _argument_problems(
            replicas=replicas, batch_size=batch_size, steps=steps, mode=mode,
            replicas_to_aggregate=replicas_to_aggregate, max_staleness=max_staleness,
            checkpoint_every=checkpoint_every, checkpoint_dir=checkpoint_dir, resume_from=resume_from,
            nonfinite=nonfinite, seed=seed, metrics_interval_s=metrics_interval_s, timeout_s=timeout_s,
        )  # fmt: skip
        if not problems:
            if replicas > len(workers):
                problems.append(
                    f"{replicas} replicas need {replicas} training workers and the cluster has {len(workers)}: "
                    f"pass replicas={len(workers)}, or start the cluster with workers={replicas}"
                )
            if ps_placement is None:
                ps_placement = "colocated" if cluster.ps_placement == "colocated" else "dedicated"
            if ps_placement not in ("dedicated", "colocated"):
                problems.append(f"ps_placement must be 'dedicated' or 'colocated', got {ps_placement!r}")
            # Checked here, in the caller: the job starts its servers on its own thread, after cg.train returned.
            elif ps_placement == "dedicated" and not cluster.ps_workers():
                problems.append(
                    "the cluster has no parameter-server worker: start it with Cluster.local(ps=1), give workers "
                    "the Dask resource 'ps', call cluster.assign(ps=...), or pass ps_placement='colocated' "
                    "(a shard in each training worker)"
                )
        try:
            config = optimizer_config(optimizer)
        except TrainingError as err:
            problems.append(str(err))
        if problems:
            raise TrainingError("cg.train: " + "; ".join(problems))
        k = replicas if replicas_to_aggregate is None else replicas_to_aggregate
        training = TrainingConfig(mode, k if mode == "sync" else 1, max_staleness, checkpoint_every or 0, nonfinite)
        tg = prepare(loss)
        _check_held_dtypes(tg)
        _warn_of_float16_without_a_loss_scale(loss)
        arrays = arrays_for(loss.graph, tg, data)
        check_feeds(loss.graph, tg, arrays, batch_size)
        counts = {p: rows_of(a) for p, a in zip(tg.placeholders, arrays, strict=True)}
        if len(set(counts.values())) != 1:
            raise TrainingError(
                "cg.train: data arrays must have the same number of rows, got "
                + ", ".join(f"{p}: {n}" for p, n in counts.items())
            )
        total = next(iter(counts.values()))
        shard_rows = total // replicas
        if batch_size > shard_rows:
            raise TrainingError(
                f"cg.train: batch_size {batch_size} is larger than a replica's shard ({shard_rows} rows: {total} over "
                f"{replicas} replicas): pass batch_size<={shard_rows}, or fewer replicas"
            )
        return cls(
            loss=loss, graph=tg, arrays=tuple(arrays), optimizer=config, training=training, replicas=replicas,
            batch_size=batch_size, steps=steps, checkpoint_every=checkpoint_every,
            checkpoint_dir=None if checkpoint_dir is None else Path(checkpoint_dir), resume_from=resume_from,
            seed=seed, metrics_interval_s=float(metrics_interval_s), timeout_s=float(timeout_s),
            ps_placement="colocated" if ps_placement == "colocated" else "dedicated",
        )  # fmt: skip


def _check_held_dtypes(tg: TrainingGraph) -> None:
    """The parameter servers keep float32 and float64 only: say so here, before a server refuses the job's Init."""
    narrow = [name for name in tg.held if tg.initial[name].dtype.name not in TRAINABLE]
    if narrow:
        found = ", ".join(f"{name!r} ({tg.initial[name].dtype.name})" for name in narrow)
        raise TrainingError(
            f"cg.train: the parameter servers keep variables in {' or '.join(TRAINABLE)} only, and {found} "
            "would be trained or updated on them; create them in float32 (with float16 or bfloat16 compute, "
            "cast them in the forward pass)"
        )


def _warn_of_float16_without_a_loss_scale(loss: Tensor) -> None:
    """A forward pass in float16 (a ``mixed_float16`` policy) trains on a cluster with no loss scale: say so.

    Its gradients are float16 until they reach the float32 variables, and
    those below float16's smallest subnormal (6e-08) become zero: the model
    trains to another result without a word. bfloat16 has float32's range and
    needs no scale.
    """
    from cellgraph.dataflow.executor import schedule

    half = next((n for n in schedule([loss], [], []) if any(spec.dtype == "float16" for spec in n.specs)), None)
    if half is not None:
        warnings.warn(
            f"cg.train: the loss's forward pass computes in float16 ({half.op} {half.name!r}, and others), and a "
            "cluster job applies no loss scale, so float16 gradients below 6e-08 become zero; on a cluster, compute "
            "in bfloat16 (cg.layers.policy('mixed_bfloat16'), float32's range) or float32, or train with "
            "cg.optim.mixed_precision in a local Session",
            CellgraphWarning,
            stacklevel=4,
        )


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def no_training_worker(cluster: Cluster, replicas: int | None) -> str:
    """Why a job cannot train on ``cluster``, which has no training worker now: how many workers it has, and
    how to start one."""
    ps = len(cluster.ps_workers())
    asked = f"{replicas} replica(s) need" if replicas is not None else "a replica needs"
    start = (
        "start the cluster with Cluster.local(workers=1) or more"
        if cluster.kind == "local"
        else f"start one with dask worker {cluster.scheduler_address} --resources worker=1"
    )
    return (
        f"the cluster at {cluster.scheduler_address} has no training worker (0 training workers and {ps} "
        f"parameter-server worker(s), which never train): {asked} a Dask worker without the 'ps' resource; {start}"
    )


def _argument_problems(
    *,
    replicas: Any,
    batch_size: Any,
    steps: Any,
    mode: Any,
    replicas_to_aggregate: Any,
    max_staleness: Any,
    checkpoint_every: Any,
    checkpoint_dir: Any,
    resume_from: Any,
    nonfinite: Any,
    seed: Any,
    metrics_interval_s: Any,
    timeout_s: Any,
) -> list[str]:
    """Every argument of ``cg.train`` that is wrong on its own or beside another one, each named."""
    problems = []
    if not _is_int(replicas) or replicas < 1:
        problems.append(f"replicas must be an int of at least 1, got {replicas!r}")
    if not _is_int(batch_size) or batch_size < 1:
        problems.append(f"batch_size must be an int of at least 1, got {batch_size!r}")
    if not _is_int(steps) or steps < 0:
        problems.append(f"steps must be an int, 0 or more, got {steps!r}")
    if mode not in ("sync", "async"):
        problems.append(f"mode must be 'sync' or 'async', got {mode!r}")
    if replicas_to_aggregate is not None:
        if mode == "async":
            problems.append(
                f"replicas_to_aggregate is for mode='sync' (async mode applies every gradient on arrival), "
                f"got {replicas_to_aggregate!r}"
            )
        elif not _is_int(replicas_to_aggregate) or (
            _is_int(replicas) and not 1 <= replicas_to_aggregate <= max(replicas, 1)
        ):
            problems.append(
                f"replicas_to_aggregate must be between 1 and replicas ({replicas}), got {replicas_to_aggregate!r}"
            )
    if max_staleness is not None and (not _is_int(max_staleness) or max_staleness < 0):
        problems.append(f"max_staleness must be an int, 0 or more (or None: no bound), got {max_staleness!r}")
    if checkpoint_every is not None and (not _is_int(checkpoint_every) or checkpoint_every < 1):
        problems.append(f"checkpoint_every must be an int of at least 1 (or None), got {checkpoint_every!r}")
    problems += _checkpoint_problems(checkpoint_dir, resume_from)
    if nonfinite not in NONFINITE:
        problems.append(f"nonfinite must be one of {', '.join(map(repr, NONFINITE))}, got {nonfinite!r}")
    if not _is_int(seed) or seed < 0:
        problems.append(f"seed must be an int, 0 or more, got {seed!r}")
    if not _is_number(metrics_interval_s) or metrics_interval_s < 0:
        problems.append(f"metrics_interval_s must be a finite number of seconds, 0 or more, got {metrics_interval_s!r}")
    if not _is_number(timeout_s) or timeout_s <= 0:
        problems.append(f"timeout_s must be a finite, positive number of seconds, got {timeout_s!r}")
    return problems


def _checkpoint_problems(checkpoint_dir: Any, resume_from: Any) -> list[str]:
    """``checkpoint_dir`` and ``resume_from``: a folder (or None), and a checkpoint that folder holds."""
    if checkpoint_dir is not None and not isinstance(checkpoint_dir, (str, os.PathLike)):
        return [f"checkpoint_dir must be a path (str or pathlib.Path) or None, got {type(checkpoint_dir).__name__}"]
    folder = None if checkpoint_dir is None else Path(checkpoint_dir)
    if folder is not None and folder.exists() and not folder.is_dir():
        return [f"checkpoint_dir {str(folder)!r} is a file, not a folder"]
    if resume_from is None:
        return _another_jobs_checkpoints(folder)
    if not isinstance(resume_from, str) or not resume_from:
        return [f"resume_from must be a checkpoint's name (e.g. 'ckpt-0000000300') or None, got {resume_from!r}"]
    if folder is None:
        return [
            f"resume_from={resume_from!r} needs checkpoint_dir, the folder that holds it "
            "(without one, the job writes into a new temporary folder)"
        ]
    # The folder may live on the parameter-server machines only: then the servers say whether it is there.
    if folder.is_dir() and not (folder / resume_from).is_dir():
        held = held_checkpoints(folder)
        return [
            f"resume_from {resume_from!r} is not in checkpoint_dir {str(folder)!r} "
            f"(it holds {', '.join(held) or 'no checkpoint'})"
        ]
    return []


def held_checkpoints(folder: Path) -> list[str]:
    """The checkpoints' folders (``ckpt-...``) in ``folder``, oldest first; none where this process cannot see it."""
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if p.is_dir() and p.name.startswith("ckpt-"))


def _another_jobs_checkpoints(folder: Path | None) -> list[str]:
    """A new job (no ``resume_from``) in a folder that holds checkpoints: refused, as it would write over them.

    Before, it wrote its own checkpoints under the same names, one step's files over the other job's (a mix that
    export then refused), and where it wrote fewer, ``cg.save_model``/``cg.onnx.export`` of the folder read the old
    job's newer step without a word. As TensorFlow's ``Saver`` and torch's checkpoints are used, a folder is one
    run's: a job goes on with it by resuming from it. Where only the PS machines see the folder, nothing is checked.
    """
    held = [] if folder is None else held_checkpoints(folder)
    if not held:
        return []
    kept = held[0] if len(held) == 1 else f"{len(held)}, {held[0]} to {held[-1]}"
    return [
        f"checkpoint_dir {str(folder)!r} already holds checkpoints of another job ({kept}): a new job would write "
        "its own over those of the same steps, and cg.save_model or cg.onnx.export of the folder would read "
        f"whichever job wrote the newest; pass resume_from={held[-1]!r} to go on from that job's newest, or give "
        "the new job a folder of its own (an empty or new one, or none: a temporary folder)"
    ]


def optimizer_config(optimizer: Optimizer | OptimizerConfig | None) -> OptimizerConfig:
    """The parameter servers' form of a ``cg.optim`` optimizer (default ``Adam(1e-3)``): the same registry entry."""
    if isinstance(optimizer, MixedPrecision):
        raise TrainingError(
            f"optimizer {optimizer!r}: mixed precision runs in a local Session only (the parameter servers apply "
            f"plain optimizers and keep no loss scale); on a cluster, pass a plain one (its own: "
            f"{optimizer.optimizer!r}) with the forward pass in float32 or bfloat16 (float16 needs a loss scale)"
        )
    try:
        if optimizer is None:
            return OptimizerConfig("adam", 1e-3)
        if isinstance(optimizer, OptimizerConfig):
            return optimizer
        if isinstance(optimizer, Optimizer) and optimizer.kind in CLASSES:
            return OptimizerConfig(optimizer.kind, optimizer.learning_rate, **optimizer.hyperparameters)
    except ParameterServerError as err:
        raise TrainingError(f"optimizer {optimizer!r}: {err}") from None
    *others, last = (f"cg.optim.{cls.__name__}" for cls in CLASSES.values())
    raise TrainingError(
        f"optimizer {optimizer!r} is not one the parameter servers run: use {', '.join(others)} or {last}"
    )


def arrays_for(graph: Graph, tg: TrainingGraph, data: Any) -> list[Any]:
    """``data`` as one array per placeholder of ``tg``, in ``tg.placeholders`` order.

    A dict's tensor keys must be placeholders of ``graph`` (the loss's): a
    placeholder of another graph with the same name is refused, as
    ``Session.run`` refuses it.
    """
    wanted = tg.placeholders
    if isinstance(data, Mapping):
        by_name: dict[str, Any] = {}
        for key, value in data.items():
            if isinstance(key, Tensor) and key not in graph:
                raise TrainingError(
                    f"cg.train: feed {key.name!r} is not in the loss's graph (another graph, or its cell was re-run): "
                    "give data for the placeholders the loss was built from"
                )
            name = key.name if isinstance(key, Tensor) else str(key)
            by_name[name if ":" in name else f"{name}:0"] = value
        missing = [p for p in wanted if p not in by_name]
        if missing:
            raise TrainingError(
                f"cg.train: no data for placeholder(s) {', '.join(map(repr, missing))}, which the loss needs; "
                f"data has {', '.join(map(repr, by_name)) or 'nothing'}"
            )
        return [_array(by_name[p], p) for p in wanted]
    if isinstance(data, (tuple, list)):
        if len(data) != len(wanted):
            raise TrainingError(
                f"cg.train: data has {len(data)} array(s) but the loss needs {len(wanted)} placeholder(s) "
                f"({', '.join(map(repr, wanted))}): give one array per placeholder, in that order, "
                "or a dict {placeholder: array}"
            )
        return [_array(a, p) for a, p in zip(data, wanted, strict=True)]
    raise TrainingError(
        f"cg.train: data must be a tuple of arrays or a dict {{placeholder: array}}, got {type(data).__name__}"
    )


def check_feeds(graph: Graph, tg: TrainingGraph, arrays: list[Any], batch_size: int) -> None:
    """Check that a batch of each array is a feed its placeholder takes, by ``Session.run``'s rule and words.

    A batch (``batch_size`` rows) is what a replica feeds: it is checked, not
    the whole array, so that a placeholder of a fixed batch dimension is
    judged as it will run. Only the dtype and the shape are looked at: a
    ``dask.array`` is never computed here.
    """
    for i, (name, array) in enumerate(zip(tg.placeholders, arrays, strict=True)):
        if array.ndim == 0:
            raise TrainingError(f"cg.train: the data for placeholder {name!r} is a scalar: give one row per example")
        placeholder = graph.tensor(name)
        try:
            convert_feed(placeholder, _batch_like(array, batch_size))
        except CellgraphError as err:
            raise TrainingError(
                # The whole array's shape too: the feed error names only the batch's, which hides a wrong width.
                f"cg.train: data for placeholder {name!r} (an array of shape {tuple(array.shape)}), in batches of "
                f"{batch_size}: {err}" + _swapped(graph, tg.placeholders, arrays, i, batch_size)
            ) from err
        # Its numbers too, where a cast narrows them (int64 labels into int32, float64 data past float32's range,
        # which a cast makes inf): one pass, before any replica starts, as a Session's feed check does.
        if isinstance(array, np.ndarray) and not np.can_cast(array.dtype, placeholder.dtype):
            outside = outside_int_range(array, placeholder.dtype) or past_float_range(array, placeholder.dtype)
            if outside is not None:
                raise TrainingError(
                    f"cg.train: data for placeholder {name!r} ({array.dtype}) does not fit {placeholder.dtype}: "
                    f"{outside}"
                )


def _batch_like(array: Any, batch_size: int) -> np.ndarray:
    """A stand-in of a batch of ``array``'s shape and dtype that takes no memory: every element is the same zero."""
    return np.broadcast_to(np.zeros((), dtype=array.dtype), (batch_size, *array.shape[1:]))


def _swapped(graph: Graph, names: list[str], arrays: list[Any], i: int, batch_size: int) -> str:
    """A hint when array ``i`` would fit another placeholder: the data given out of order (``--data
    y_train,x_train``) said only that the labels did not fit the images' placeholder."""

    def fits(name: str, array: Any) -> bool:
        try:
            convert_feed(graph.tensor(name), _batch_like(array, batch_size))
        except CellgraphError:
            return False
        return True

    for j in range(len(names)):
        if j != i and fits(names[j], arrays[i]):
            return (
                f". The array given for {names[i]!r} (argument {i + 1}) would fit placeholder {names[j]!r}: give the "
                f"data in the loss's placeholder order ({', '.join(map(repr, names))})"
            )
    return ""


def _array(value: Any, placeholder: str) -> Any:
    """A NumPy array, or a ``dask.array`` whose rows are known (a replica's shard is a slice of them)."""
    # Not imported to ask: a dask array exists only once its module is (importing it costs %train 0.2 s).
    da = sys.modules.get("dask.array")
    if da is None or not isinstance(value, da.Array):
        return np.asarray(value)
    if value.ndim == 0 or math.isnan(value.shape[0]):
        raise TrainingError(
            f"cg.train: the dask array for placeholder {placeholder!r} has "
            f"{'no rows' if value.ndim == 0 else 'unknown chunk sizes'}"
            ": call .compute_chunk_sizes() on it first, so that its rows can be split over the replicas"
        )
    return value


def rows_of(array: Any) -> int:
    """Rows of one data array (0 for a scalar)."""
    return int(array.shape[0]) if array.ndim else 0


def shard_rows(total: int, replicas: int, index: int) -> slice:
    """The rows of replica ``index``'s shard: contiguous blocks whose sizes differ by at most one.

    The first ``total % replicas`` shards hold one row more, so every row is
    some replica's (as ``tf.data.Dataset.shard`` gives every element to some
    worker); none is dropped when the rows do not divide evenly.

    Examples
    --------
    >>> [shard_rows(11, 3, i) for i in range(3)]
    [slice(0, 4, None), slice(4, 8, None), slice(8, 11, None)]
    """
    per, extra = divmod(total, replicas)
    start = index * per + min(index, extra)
    return slice(start, start + per + (1 if index < extra else 0))


__all__ = ["JobSpec", "arrays_for", "check_feeds", "held_checkpoints", "optimizer_config", "rows_of", "shard_rows"]
