"""What one shard does with a push: refuse it, drop it as stale, add it to the sync step, or apply it.

``ParameterStore`` holds a shard's state (its tensors, their versions, the
global step, the registered replicas) and the lock that guards it.
``PushRules`` decides, under that lock, what a push does to that state, and
keeps what only the push path needs: the sync step in progress (who pushed
for it, and why its update will be dropped when a gradient held NaN or Inf),
the arithmetic that sums and applies (``shard_updates.py``), and the counters
the shard reports.

It changes no step itself: ``take`` returns a ``Taken`` that says whether an
update was applied and whether the global step moves on, and the store
advances its versions and step (and wakes its waiters) accordingly. Every
check runs before anything changes, so a refused push leaves the shard as it
was, apart from the count of refused pushes.

Examples
--------
>>> import numpy as np
>>> from cellgraph.cluster.ps.config import OptimizerConfig, TrainingConfig, VariableSpec
>>> from cellgraph.cluster.ps.records import Replica
>>> from cellgraph.cluster.ps.shard_layout import ShardLayout
>>> from cellgraph.cluster.ps.tensor_table import TensorTable
>>> shard = ShardLayout([VariableSpec("w", np.dtype("float32"), (2,))], "sgd")
>>> table = TensorTable(shard, {"w": np.zeros(2, np.float32)})
>>> rules = PushRules("job", shard, table, OptimizerConfig("sgd", 1.0), TrainingConfig("sync", replicas_to_aggregate=2))
>>> replicas = {0: Replica(), 1: Replica()}
>>> rules.take(replicas, 0, 0, 0, {"w": np.ones(2, np.float32)})
Taken(status='aggregated', staleness=0, update=False, advance=False)
>>> rules.take(replicas, 0, 1, 0, {"w": np.full(2, 3.0, np.float32)})
Taken(status='applied', staleness=0, update=True, advance=True)
>>> table.lend("w")
array([-2., -2.], dtype=float32)
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from ..errors import ParameterServerError
from .config import OptimizerConfig, TrainingConfig, listed
from .nonfinite import first_nonfinite
from .pieces import Gradient
from .records import Replica
from .shard_layout import ShardLayout
from .shard_updates import Fused, ShardUpdates
from .tensor_table import TensorTable


@dataclass(frozen=True)
class Taken:
    """What a push did: its status and staleness (as ``PushOutcome`` reports them), and what the store must do.

    ``update``: an update was applied (every version and the global step
    advance). ``advance``: the global step advances (an update, or a sync step
    dropped whole for a NaN or Inf).
    """

    status: Literal["applied", "aggregated", "stale", "skipped"]
    staleness: int
    update: bool = False
    advance: bool = False


def _plural(word: str, ids: Sequence[int]) -> str:
    """``replica 0`` / ``replicas 1, 2``."""
    return f"{word}{'s' if len(ids) != 1 else ''} {', '.join(map(str, ids))}"


class PushRules:
    """How one shard takes pushes (see the module); every method is called under the store's lock."""

    def __init__(
        self,
        job_id: str,
        shard: ShardLayout,
        table: TensorTable,
        optimizer: OptimizerConfig,
        training: TrainingConfig,
    ) -> None:
        self.job_id, self.shard, self.training = job_id, shard, training
        # The arithmetic: the sync sum of this step's gradients and the updates (shard_updates.py).
        self.arithmetic = ShardUpdates(shard, table, optimizer, sync=training.mode == "sync")
        self.contributors: list[int] = []  # sync mode: who pushed for this step
        self.skip_reason: str | None = None  # sync, skip_step: why this step's update will be dropped
        self.applied = self.stale = self.rejected = self.updates = 0
        self.steps_skipped, self.last_skipped = 0, ""

    def take(
        self,
        replicas: Mapping[int, Replica],
        global_step: int,
        replica_id: int,
        step: int,
        grads: Mapping[str, Gradient],
        finite: Collection[str] = (),
        reported: str = "",
        fused: Fused | None = None,
    ) -> Taken:
        """What replica ``replica_id``'s push for ``step`` does at ``global_step`` (``ParameterStore.push``)."""
        try:
            self._check(replicas, global_step, replica_id, step, grads)
        except ParameterServerError:
            self.rejected += 1
            raise
        nonfinite = None
        if self.training.nonfinite != "apply":
            nonfinite = reported or first_nonfinite(
                replica_id, step, ((name, grads[name]) for name in self.shard.specs), finite
            )
        if nonfinite is not None and self.training.nonfinite == "reject":
            self.rejected += 1
            raise ParameterServerError(
                f"{nonfinite}; job {self.job_id!r} refuses non-finite gradients (nonfinite='reject'; "
                "cg.train(..., nonfinite='skip_step') drops such a step instead)",
                "INVALID_ARGUMENT",
            )
        replicas[replica_id].saw_push(step)
        staleness = global_step - step
        if self.training.mode == "sync":
            return self._aggregate(replica_id, staleness, grads, nonfinite, fused, global_step)
        if self.training.max_staleness is not None and staleness > self.training.max_staleness:
            self.stale += 1
            return Taken("stale", staleness)
        if nonfinite is not None:
            # Async skip_step: a push is its own step; dropping it leaves the step where it is.
            self._record_skip(nonfinite)
            return Taken("skipped", staleness)
        self.arithmetic.apply_push(grads, fused, global_step)
        self.applied += 1
        self.updates += 1
        return Taken("applied", staleness, update=True, advance=True)

    def _check(
        self,
        replicas: Mapping[int, Replica],
        global_step: int,
        replica_id: int,
        step: int,
        grads: Mapping[str, Gradient],
    ) -> None:
        """Raise the error a malformed push deserves."""
        specs = self.shard.specs
        if replica_id not in replicas:
            raise ParameterServerError(
                f"replica {replica_id} is not registered with job {self.job_id!r}; call Register first",
                "FAILED_PRECONDITION",
            )
        unknown = [name for name in grads if name not in specs]
        if unknown:
            raise ParameterServerError(
                f"replica {replica_id} pushed a gradient for {listed(unknown)}, which this shard "
                f"does not hold; it holds {listed(specs) or 'no variables'}",
                "NOT_FOUND",
            )
        missing = [name for name in specs if name not in grads]
        if missing:
            raise ParameterServerError(
                f"replica {replica_id}'s push for step {step} lacks a gradient for {listed(missing)}; "
                "a push must carry one for every variable of the shard",
                "INVALID_ARGUMENT",
            )
        shard = self.shard
        for name in specs:
            if not shard.fits(name, grads[name]):  # the message made only for a gradient that may be wrong
                what = f"replica {replica_id}'s gradient for {name!r}"
                shard.check_tensor(what, grads[name], name, "the variable has", "INVALID_ARGUMENT")
        if step < 0:
            raise ParameterServerError(f"step {step} is negative", "INVALID_ARGUMENT")
        if step > global_step:
            raise ParameterServerError(
                f"step {step} is from the future: the global step is {global_step}", "INVALID_ARGUMENT"
            )
        if self.training.mode == "sync" and step == global_step and replica_id in self.contributors:
            raise ParameterServerError(
                f"replica {replica_id} already pushed a gradient for step {step}", "ALREADY_EXISTS"
            )

    def _record_skip(self, reason: str) -> None:
        self.steps_skipped += 1
        self.last_skipped = reason

    def _aggregate(
        self,
        replica_id: int,
        staleness: int,
        grads: Mapping[str, Gradient],
        nonfinite: str | None,
        fused: Fused | None,
        global_step: int,
    ) -> Taken:
        """Sync mode: add a checked push to this step's sum, and apply the mean when it is complete."""
        if staleness > 0:
            self.stale += 1
            return Taken("stale", staleness)
        if nonfinite is not None:
            self.skip_reason = self.skip_reason or nonfinite  # the sum is dropped whole: no need to add it
        elif self.skip_reason is None:
            self.arithmetic.add(grads, fused)
        self.contributors.append(replica_id)
        if len(self.contributors) < self.training.replicas_to_aggregate:
            return Taken("aggregated", 0)
        return self._apply_mean(global_step)

    def _apply_mean(self, global_step: int) -> Taken:
        """Sync mode: apply the mean of this step's gradients, which ends the step.

        With ``nonfinite="skip_step"`` and a NaN or Inf among them, the step's
        update is dropped whole, but the global step still advances: every
        replica waiting for it goes on from the same values (rather than
        staying stuck, or being sent back to recompute a step whose pushes
        were all counted), and the skip is counted for the job to report.
        """
        if self.skip_reason is not None:
            self._record_skip(self.skip_reason)
            self.discard()
            return Taken("skipped", 0, advance=True)
        contributed = len(self.contributors)
        self.arithmetic.apply_mean(contributed, global_step)
        self.applied += contributed
        self.updates += 1
        self.discard()
        return Taken("applied", 0, update=True, advance=True)

    def reconfigure(self, replicas_to_aggregate: int, global_step: int) -> Taken | None:
        """Sync mode: steps of ``replicas_to_aggregate`` gradients from now on; what the step in progress did when
        it already has that many (its mean applied: a removed or stopping replica leaves no other waiting)."""
        if self.training.mode != "sync":
            raise ParameterServerError(
                f"job {self.job_id!r} trains in async mode: replicas_to_aggregate applies to sync mode only",
                "FAILED_PRECONDITION",
            )
        self.training = replace(self.training, replicas_to_aggregate=replicas_to_aggregate)  # checks k >= 1
        if self.contributors and len(self.contributors) >= replicas_to_aggregate:
            return self._apply_mean(global_step)
        return None

    def discard(self) -> None:
        """Forget the sync step in progress: its sum, who pushed, why it would be dropped."""
        self.arithmetic.discard()
        self.contributors.clear()
        self.skip_reason = None

    def waiting_message(self, step: int, timeout: float, global_step: int, replicas: Iterable[int]) -> str:
        """Why a wait for global ``step`` ran out: in sync mode, who has pushed for the current step and who not."""
        message = f"waited {float(timeout)} s for global step {step}, still at {global_step}"
        if self.training.mode != "sync":
            return message
        arrived = sorted(self.contributors)
        pending = sorted(set(replicas) - set(arrived))
        message += f": {len(arrived)} of {self.training.replicas_to_aggregate} gradients for step {global_step} arrived"
        if arrived:
            message += f" (from {_plural('replica', arrived)})"
        return message + (
            f"; not yet from {_plural('replica', pending)}" if pending else "; no other replica is registered"
        )
