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
    statuses = tuple(_STATUS_NAMES.get(answers[s].status, "unknown") for s in sorted(answers))
    if "stale" in statuses:
        status = "stale"
    elif all(s == "applied" for s in statuses):
        status = "applied"
    elif "skipped" in statuses:
        status = "skipped"
    else:
        status = "aggregated"
    return PushResult(
        status=status,
        global_step=min(a.global_step for a in answers.values()),
        staleness=max(a.staleness for a in answers.values()),
        by_shard=statuses,
    )
