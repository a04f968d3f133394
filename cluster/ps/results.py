"""What a ``ParameterClient`` gives back: the job it joined, what it pulled, what the shards did with a push.

Examples
--------
>>> from cellgraph.protos import parameter_service_pb2 as pb
>>> answers = {0: pb.PushResponse(status=pb.PushResponse.APPLIED, global_step=4),
...            1: pb.PushResponse(status=pb.PushResponse.AGGREGATED, global_step=3)}
>>> push_result(answers)
PushResult(status='aggregated', global_step=3, staleness=0, by_shard=('applied', 'aggregated'))
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from cellgraph.protos import parameter_service_pb2 as pb

from .config import OptimizerConfig, TrainingConfig
from .sharding import Layout

_STATUS_NAMES = {
    pb.PushResponse.APPLIED: "applied",
    pb.PushResponse.AGGREGATED: "aggregated",
    pb.PushResponse.STALE: "stale",
    pb.PushResponse.SKIPPED: "skipped",
}


@dataclass(frozen=True)
class JobInfo:
    """What ``register`` learns: the job, where its variables live, and its rules."""

    job_id: str
    global_step: int
    layout: Layout
    training: TrainingConfig
    optimizer: OptimizerConfig


@dataclass(frozen=True)
class PullResult:
    """Whole variables, the global step (the lowest over the shards read) and each variable's version."""

    values: dict[str, np.ndarray]
    global_step: int
    versions: dict[str, int]


@dataclass(frozen=True)
class PushResult:
    """What the shards did with a push: ``stale`` if any shard dropped it, else ``applied`` if all
    applied it, else ``skipped`` if any dropped its step for a non-finite gradient (``nonfinite="skip_step"``),
    else ``aggregated``; ``global_step`` is the lowest over the shards."""

    status: str
    global_step: int
    staleness: int
    by_shard: tuple[str, ...]


def push_result(answers: Mapping[int, pb.PushResponse]) -> PushResult:
    """One result for a push from every shard's answer: the worst status, the lowest step."""
    # Loops, not generators: this runs every step, and a one-shard push is the common case.
    names: list[str] = []
    global_step = staleness = None
    for shard in sorted(answers):
        answer = answers[shard]
        names.append(_STATUS_NAMES.get(answer.status, "unknown"))
        global_step = answer.global_step if global_step is None else min(global_step, answer.global_step)
        staleness = answer.staleness if staleness is None else max(staleness, answer.staleness)
    statuses = tuple(names)
    if "stale" in statuses:
        status = "stale"
    elif statuses.count("applied") == len(statuses):
        status = "applied"
    elif "skipped" in statuses:
        status = "skipped"
    else:
        status = "aggregated"
    if global_step is None or staleness is None:
        raise ValueError("push_result needs at least one shard's answer")
    return PushResult(status=status, global_step=global_step, staleness=staleness, by_shard=statuses)
