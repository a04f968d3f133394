"""What a step sends and receives, per shard: a push's pieces, a pull's plan (kept for the caller's own arrays),
and the pull's result; each checked against the job's layout before anything is sent.

``ParameterClient`` and ``StreamedStep`` build every push and pull from
these, so a wrong name, shape or destination is refused in the same words
whichever way the step goes.

Examples
--------
>>> import numpy as np
>>> from .config import VariableSpec
>>> layout = {"w": [(0, VariableSpec("w", np.dtype("float32"), (2, 2)))]}
>>> [(shard, [(spec.name, piece.tolist()) for spec, piece in pieces])
...  for shard, pieces in push_pieces(layout, {"w": np.ones((2, 2), np.float32)}).items()]
[(0, [('w', [[1.0, 1.0], [1.0, 1.0]])])]
>>> out = {"w": np.zeros((2, 2), np.float32)}
>>> kept = {}
>>> pull_plan(layout, None, 0, 1 << 20, out, kept) is pull_plan(layout, None, 0, 1 << 20, out, kept)
True
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from cellgraph.dataflow.shapes import fmt

from ..errors import ParameterServerError
from .config import VariableSpec
from .held import PullPlan, rows
from .results import PullResult
from .sharding import Layout

# Pull plans a client keeps for reuse: the last one only, so that at most one set of the caller's arrays is held
# beyond its use (a caller pulling into new arrays each time would otherwise keep several models alive).
PLANS_KEPT = 1

PlanKey = tuple[tuple[str, ...], int, tuple[int, ...]]


def pull_plan(
    layout: Layout,
    names: Sequence[str] | None,
    replica_id: int,
    max_chunk: int,
    out: Mapping[str, np.ndarray] | None,
    kept: dict[PlanKey, PullPlan],
) -> PullPlan:
    """The plan of a pull of ``names`` (all when None) into ``out``: the one in ``kept`` when it was made for these
    very arrays (and they are still writable and of their shapes), else a new one, kept when it pulls into the
    caller's arrays."""
    wanted = list(layout) if names is None else list(names)
    unknown = [n for n in wanted if n not in layout]
    if unknown:
        raise ParameterServerError(
            f"pull of unknown variable(s) {', '.join(map(repr, unknown))}; the job has: {', '.join(layout)}",
            "NOT_FOUND",
        )
    if out is not None:
        extra = [n for n in out if n not in wanted]
        if extra:
            raise ParameterServerError(
                f"pull(out=...) names {', '.join(map(repr, extra))}, which this pull does not fetch; "
                f"it fetches: {', '.join(wanted)}",
                "INVALID_ARGUMENT",
            )
    if out is None:  # new arrays every time: nothing to keep
        return PullPlan(layout, wanted, replica_id, max_chunk, out)
    # Not keyed by min_step: a sync replica's grows every step, and each pull adds its own (wire_for).
    key = (tuple(wanted), replica_id, tuple(map(id, out.values())))
    plan = kept.get(key)
    if plan is not None and plan.reuses(out):
        return plan
    plan = PullPlan(layout, wanted, replica_id, max_chunk, out)
    if plan.reuses(out):  # pulls into the caller's arrays only
        if len(kept) >= PLANS_KEPT:
            kept.clear()
        kept[key] = plan
    return plan


def pull_result(plan: PullPlan, answers: Mapping[int, tuple[int, dict[str, int]]]) -> PullResult:
    """The values ``plan`` pulled, the lowest global step of the shards' answers, and each variable's lowest
    version (a split variable's pieces come from several shards)."""
    versions: dict[str, int] = {}
    lowest: int | None = None
    for step, shard_versions in answers.values():
        lowest = step if lowest is None else min(lowest, step)
        for name, version in shard_versions.items():
            versions[name] = min(version, versions.get(name, version))
    if lowest is None:
        raise ValueError("pull_result needs at least one shard's answer")
    return PullResult(dict(plan.whole), lowest, versions)


def push_pieces(layout: Layout, grads: Mapping[str, np.ndarray]) -> dict[int, list[tuple[VariableSpec, np.ndarray]]]:
    """Each shard's part of a push: (the piece's spec, its rows of the gradient)."""
    if not grads:
        raise ParameterServerError("a push needs at least one gradient", "INVALID_ARGUMENT")
    unknown = [n for n in grads if n not in layout]
    if unknown:
        raise ParameterServerError(
            f"gradient for unknown variable(s) {', '.join(map(repr, unknown))}; the job has: {', '.join(layout)}",
            "NOT_FOUND",
        )
    by_shard: dict[int, list[tuple[VariableSpec, np.ndarray]]] = {}
    for name, grad in grads.items():
        grad = np.asarray(grad, order="C")
        whole_shape = layout[name][0][1].whole_shape
        if grad.shape != whole_shape:
            raise ParameterServerError(
                f"gradient for '{name}' has shape {fmt(grad.shape)}, the variable's is {fmt(whole_shape)}",
                "INVALID_ARGUMENT",
            )
        for shard, spec in layout[name]:
            by_shard.setdefault(shard, []).append((spec, rows(grad, spec)))
    return by_shard


__all__ = ["PLANS_KEPT", "pull_plan", "pull_result", "push_pieces"]
