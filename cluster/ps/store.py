"""One parameter-server shard's state, and the rules that turn pushed gradients into updates.

A ``ParameterStore`` holds a shard's variables, their optimizer slots and
versions, the global step, and who pushed what. It knows nothing of gRPC: the
server wraps it and answers a ``ParameterServerError`` with the RPC status
named by its ``code``. Every push is checked completely before anything
changes, so a refused push leaves the store exactly as it was (apart from the
count of refused pushes).

Updates run the same Numba kernels as the local executor's ``Apply*`` ops,
with the scalars cast the same way, so a model trained through a parameter
server follows the trajectory it would follow in one process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace

import numpy as np

from ..errors import ParameterServerError
from .config import OptimizerConfig, TrainingConfig, VariableSpec, listed
from .nonfinite import first_nonfinite
from .pieces import Gradient
from .records import PushOutcome, Replica, StoreState, StoreStats
from .shard_layout import ShardLayout, key_mismatch
from .shard_updates import Fused, ShardUpdates
from .step_waiters import StepWaiters, check_timeout
from .tensor_table import TensorTable


def _plural(word: str, ids: Sequence[int]) -> str:
    """``replica 0`` / ``replicas 1, 2``."""
    return f"{word}{'s' if len(ids) != 1 else ''} {', '.join(map(str, ids))}"


class ParameterStore:
    """The variables, slots and training state of one parameter-server shard.

    Parameters
    ----------
    job_id
        The job this shard serves (named in error messages).
    specs
        The variables held, in order; float32 or float64, names unique.
    initial
        The initial value of every variable, exactly the spec names, dtypes and
        shapes. The store keeps its own C-contiguous copies.
    optimizer, training
        The update applied with the (averaged) gradient, and how pushes become
        updates (``sync``: the mean of ``replicas_to_aggregate`` gradients per
        step; ``async``: every fresh enough gradient on arrival).

    Examples
    --------
    >>> import numpy as np
    >>> from cellgraph.cluster.ps.config import OptimizerConfig, TrainingConfig, VariableSpec
    >>> spec = VariableSpec("w", np.dtype("float32"), (2,))
    >>> store = ParameterStore(
    ...     "job", [spec], {"w": np.zeros(2, np.float32)},
    ...     OptimizerConfig("sgd", learning_rate=0.5), TrainingConfig("sync", replicas_to_aggregate=2),
    ... )
    >>> store.register(0), store.register(1)
    (0, 0)
    >>> store.push(0, 0, {"w": np.array([1.0, 2.0], np.float32)}).status
    'aggregated'
    >>> store.push(1, 0, {"w": np.array([3.0, 4.0], np.float32)})
    PushOutcome(status='applied', global_step=1, staleness=0)
    >>> store.read(["w"])
    (1, {'w': (1, array([-1. , -1.5], dtype=float32))})
    """

    def __init__(
        self,
        job_id: str,
        specs: Sequence[VariableSpec],
        initial: Mapping[str, np.ndarray],
        optimizer: OptimizerConfig,
        training: TrainingConfig,
    ) -> None:
        self.job_id = job_id
        self.optimizer = optimizer
        self.training = training
        self._shard = ShardLayout(specs, optimizer.kind)
        self.specs = self._shard.specs
        self._check_initial(initial)

        self._lock = threading.Condition()
        # Every tensor by checkpoint key, the small variables side by side in one buffer per group: an update
        # runs once per group (tensor_table.py). Readers get views; an update copies only what is still read.
        self._table = TensorTable(
            self._shard,
            {
                key: initial[key] if key in self.specs else np.zeros(shape, dtype)
                for key, (dtype, shape) in self._shard.tensors.items()
            },
        )
        # The arithmetic: the sync sum of this step's gradients and the updates (shard_updates.py).
        self._arithmetic = ShardUpdates(self._shard, self._table, optimizer, sync=training.mode == "sync")
        self._versions = dict.fromkeys(self.specs, 0)
        self._global_step = 0
        self._replicas: dict[int, Replica] = {}
        self._contributors: list[int] = []  # sync mode: who pushed for this step
        self._pushes_applied = self._pushes_stale = self._pushes_rejected = self._updates = 0
        self._skip_reason: str | None = None  # sync, skip_step: why this step's update will be dropped
        self._steps_skipped, self._last_skipped = 0, ""
        self._snapshot: StoreState | None = None  # see take_snapshot
        # Calls awaiting a later step (until_step): futures on the server's event loop, not threads.
        self._waiters = StepWaiters(self._lock)

    def _check_initial(self, initial: Mapping[str, np.ndarray]) -> None:
        problem = key_mismatch("initial values", initial, self.specs)
        if problem:
            raise ParameterServerError(problem, "INVALID_ARGUMENT")
        for name in self.specs:
            self._shard.check_tensor(
                f"initial value of {name!r}", initial[name], name, "the spec says", "INVALID_ARGUMENT"
            )

    @property
    def global_step(self) -> int:
        """The number of updates applied so far (or restored from a checkpoint)."""
        with self._lock:
            return self._global_step

    def register(self, replica_id: int) -> int:
        """Admit a replica and return the global step; a restarted replica may register again.

        Examples
        --------
        >>> store = ParameterStore("job", [], {}, OptimizerConfig(), TrainingConfig())
        >>> store.register(3)
        0
        """
        if replica_id < 0:
            raise ParameterServerError(f"replica id must be 0 or more, got {replica_id}", "INVALID_ARGUMENT")
        with self._lock:
            replica = self._replicas.setdefault(replica_id, Replica())
            replica.last_seen = time.time()
            return self._global_step

    def push(
        self,
        replica_id: int,
        step: int,
        grads: Mapping[str, Gradient],
        finite: Collection[str] = (),
        reported: str = "",
        fused: Fused | None = None,
    ) -> PushOutcome:
        """Take one replica's gradients, computed from the parameters at global step ``step``.

        ``grads`` must hold a gradient for every variable of the shard. In sync
        mode a push for the current step is summed with the others; the one that
        makes ``replicas_to_aggregate`` applies their mean. In async mode a push
        is applied on arrival unless it is more than ``max_staleness`` steps
        old. A push for an older step (sync) or a too old one (async) is dropped
        as ``"stale"``; a malformed one raises and changes nothing.

        ``reported``: the NaN or Inf the replica found in a gradient of this
        step held by another shard (``nonfinite.py``); this shard then treats
        the push as non-finite too, so that no shard applies half a step.

        ``fused``: gradients that arrived side by side, as one flat array each
        by their names in order (a fused chunk's content, whose views ``grads``
        holds); one that covers a group of the store's is summed or applied
        whole.

        Examples
        --------
        >>> spec = VariableSpec("w", np.dtype("float64"), ())
        >>> store = ParameterStore("job", [spec], {"w": np.array(1.0)}, OptimizerConfig(), TrainingConfig())
        >>> _ = store.register(0)
        >>> store.push(0, 0, {"w": np.array(10.0)})
        PushOutcome(status='applied', global_step=1, staleness=0)
        >>> store.push(0, 0, {"w": np.array(10.0)})
        PushOutcome(status='applied', global_step=2, staleness=1)
        >>> store.read()[1]["w"]
        (2, array(0.8))
        """
        with self._lock:
            try:
                self._check_push(replica_id, step, grads)
            except ParameterServerError:
                self._pushes_rejected += 1
                raise
            nonfinite = None
            if self.training.nonfinite != "apply":
                nonfinite = reported or self._nonfinite(replica_id, step, grads, finite)
            if nonfinite is not None and self.training.nonfinite == "reject":
                self._pushes_rejected += 1
                raise ParameterServerError(
                    f"{nonfinite}; job {self.job_id!r} refuses non-finite gradients (nonfinite='reject'; "
                    "cg.train(..., nonfinite='skip_step') drops such a step instead)",
                    "INVALID_ARGUMENT",
                )
            self._replicas[replica_id].saw_push(step)
            staleness = self._global_step - step
            if self.training.mode == "sync":
                return self._aggregate(replica_id, staleness, grads, nonfinite, fused)
            if self.training.max_staleness is not None and staleness > self.training.max_staleness:
                self._pushes_stale += 1
                return PushOutcome("stale", self._global_step, staleness)
            if nonfinite is not None:
                # Async skip_step: a push is its own step; dropping it leaves the step where it is.
                self._record_skip(nonfinite)
                return PushOutcome("skipped", self._global_step, staleness)
            self._arithmetic.apply_push(grads, fused, self._global_step)
            self._applied()
            self._pushes_applied += 1
            return PushOutcome("applied", self._global_step, staleness)

    def _check_push(self, replica_id: int, step: int, grads: Mapping[str, Gradient]) -> None:
        """Raise the error a malformed push deserves; called under the lock."""
        if replica_id not in self._replicas:
            raise ParameterServerError(
                f"replica {replica_id} is not registered with job {self.job_id!r}; call Register first",
                "FAILED_PRECONDITION",
            )
        unknown = [name for name in grads if name not in self.specs]
        if unknown:
            raise ParameterServerError(
                f"replica {replica_id} pushed a gradient for {listed(unknown)}, which this shard "
                f"does not hold; it holds {listed(self.specs) or 'no variables'}",
                "NOT_FOUND",
            )
        missing = [name for name in self.specs if name not in grads]
        if missing:
            raise ParameterServerError(
                f"replica {replica_id}'s push for step {step} lacks a gradient for {listed(missing)}; "
                "a push must carry one for every variable of the shard",
                "INVALID_ARGUMENT",
            )
        for name in self.specs:
            what = f"replica {replica_id}'s gradient for {name!r}"
            self._shard.check_tensor(what, grads[name], name, "the variable has", "INVALID_ARGUMENT")
        if step < 0:
            raise ParameterServerError(f"step {step} is negative", "INVALID_ARGUMENT")
        if step > self._global_step:
            raise ParameterServerError(
                f"step {step} is from the future: the global step is {self._global_step}", "INVALID_ARGUMENT"
            )
        if self.training.mode == "sync" and step == self._global_step and replica_id in self._contributors:
            raise ParameterServerError(
                f"replica {replica_id} already pushed a gradient for step {step}", "ALREADY_EXISTS"
            )

    def _nonfinite(
        self, replica_id: int, step: int, grads: Mapping[str, Gradient], finite: Collection[str]
    ) -> str | None:
        """What is wrong with the first gradient holding NaN or Inf, or None; called under the lock. The gradients
        named in ``finite`` were checked already (by the server, as they arrived)."""
        return first_nonfinite(replica_id, step, ((name, grads[name]) for name in self.specs), finite)

    def _record_skip(self, reason: str) -> None:
        self._steps_skipped += 1
        self._last_skipped = reason

    def _aggregate(
        self,
        replica_id: int,
        staleness: int,
        grads: Mapping[str, Gradient],
        nonfinite: str | None,
        fused: Fused | None,
    ) -> PushOutcome:
        """Sync mode: add a checked push to this step's sum, and apply the mean when it is complete."""
        if staleness > 0:
            self._pushes_stale += 1
            return PushOutcome("stale", self._global_step, staleness)
        if nonfinite is not None:
            self._skip_reason = self._skip_reason or nonfinite  # the sum is dropped whole: no need to add it
        elif self._skip_reason is None:
            self._arithmetic.add(grads, fused)
        self._contributors.append(replica_id)
        if len(self._contributors) < self.training.replicas_to_aggregate:
            return PushOutcome("aggregated", self._global_step, 0)
        skipped = self._skip_reason is not None
        self._apply_mean()
        return PushOutcome("skipped" if skipped else "applied", self._global_step, 0)

    def _apply_mean(self) -> None:
        """Sync mode: apply the mean of this step's gradients and start the next step; called under the lock.

        With ``nonfinite="skip_step"`` and a NaN or Inf among them, the step's
        update is dropped whole, but the global step still advances: every
        replica waiting for it goes on from the same values (rather than
        staying stuck, or being sent back to recompute a step whose pushes
        were all counted), and the skip is counted for the job to report.
        """
        if self._skip_reason is not None:
            self._record_skip(self._skip_reason)
            self._discard_aggregation()
            self._advance()
            return
        contributed = len(self._contributors)
        self._arithmetic.apply_mean(contributed, self._global_step)
        self._applied()
        self._pushes_applied += contributed
        self._discard_aggregation()

    def reconfigure(self, replicas_to_aggregate: int) -> int:
        """Sync mode: make a step of ``replicas_to_aggregate`` gradients from now on; return the global step.

        When this step already has that many, their mean is applied at once:
        a replica removed from the job, or a stopping one, leaves no other
        waiting for its gradient.

        Examples
        --------
        >>> spec = VariableSpec("w", np.dtype("float64"), ())
        >>> sync = TrainingConfig("sync", replicas_to_aggregate=2)
        >>> store = ParameterStore("job", [spec], {"w": np.array(1.0)}, OptimizerConfig("sgd", 0.5), sync)
        >>> _ = store.register(0)
        >>> store.push(0, 0, {"w": np.array(2.0)})
        PushOutcome(status='aggregated', global_step=0, staleness=0)
        >>> store.reconfigure(1)
        1
        >>> store.read()[1]["w"]
        (1, array(0.))
        """
        with self._lock:
            if self.training.mode != "sync":
                raise ParameterServerError(
                    f"job {self.job_id!r} trains in async mode: replicas_to_aggregate applies to sync mode only",
                    "FAILED_PRECONDITION",
                )
            self.training = replace(self.training, replicas_to_aggregate=replicas_to_aggregate)  # checks k >= 1
            if self._contributors and len(self._contributors) >= replicas_to_aggregate:
                self._apply_mean()
            return self._global_step

    def _discard_aggregation(self) -> None:
        self._arithmetic.discard()
        self._contributors.clear()
        self._skip_reason = None

    def slot_nbytes(self, name: str) -> int:
        """Bytes of variable ``name``'s optimizer slots on this shard."""
        return sum(self._table.nbytes(f"{name}/{slot}") for slot in self._shard.slots_of[name])

    def _applied(self) -> None:
        """An update of every variable was applied: their versions, the count, the next step; under the lock."""
        versions = self._versions
        for name in versions:
            versions[name] += 1
        self._updates += 1
        self._advance()

    def _advance(self) -> None:
        """The next global step (a checkpoint's copy when due), and wake the waiters; called under the lock."""
        self._global_step += 1
        every = self.training.checkpoint_every
        if every and self._global_step % every == 0:
            # Taken now, at exactly this step, so that every shard of a sync job saves the same step; the
            # server writes it outside the lock (take_snapshot). A newer one replaces one not yet taken.
            self._snapshot = self._lend_state()
        self._lock.notify_all()
        self._waiters.release(self._global_step)

    def abort_waiters(self, message: str, code: str) -> int:
        """End every call awaiting a step with ``ParameterServerError(message, code)``; return how many there were."""
        return self._waiters.abort(ParameterServerError(message, code))

    @property
    def waiting(self) -> int:
        """How many calls await a later step now."""
        return len(self._waiters)

    def take_snapshot(self) -> StoreState | None:
        """The state copied at the latest multiple of ``checkpoint_every`` not yet taken (then forgotten)."""
        with self._lock:
            snapshot, self._snapshot = self._snapshot, None
            return snapshot

    def wait_for_step(self, step: int, timeout: float) -> int:
        """Block until the global step reaches ``step``, at most ``timeout`` seconds; return the global step.

        On timeout, raise ``DEADLINE_EXCEEDED`` saying (in sync mode) which
        replicas have and have not pushed for the current step.

        Examples
        --------
        >>> store = ParameterStore("job", [], {}, OptimizerConfig(), TrainingConfig())
        >>> store.wait_for_step(0, timeout=1.0)
        0
        """
        check_timeout(timeout)
        with self._lock:
            if not self._lock.wait_for(lambda: self._global_step >= step, timeout):
                raise ParameterServerError(self._waiting_message(step, timeout), "DEADLINE_EXCEEDED")
            return self._global_step

    async def until_step(self, step: int, timeout: float) -> int:
        """Await the global step reaching ``step``, at most ``timeout`` seconds; return the global step.

        The wait is a future on the running event loop: it holds no thread, and
        a cancelled call leaves nothing behind. On timeout it raises
        ``DEADLINE_EXCEEDED`` as ``wait_for_step`` does; a restore or a stopping
        server ends it with the error they give (``abort_waiters``).
        """
        check_timeout(timeout)
        with self._lock:
            if self._global_step >= step:
                return self._global_step
            waiter = self._waiters.park(step)
        try:
            return await self._waiters.outcome(waiter, timeout)
        except TimeoutError:
            with self._lock:
                raise ParameterServerError(self._waiting_message(step, timeout), "DEADLINE_EXCEEDED") from None

    def _waiting_message(self, step: int, timeout: float) -> str:
        now = self._global_step
        message = f"waited {float(timeout)} s for global step {step}, still at {now}"
        if self.training.mode != "sync":
            return message
        arrived = sorted(self._contributors)
        pending = sorted(set(self._replicas) - set(arrived))
        message += f": {len(arrived)} of {self.training.replicas_to_aggregate} gradients for step {now} arrived"
        if arrived:
            message += f" (from {_plural('replica', arrived)})"
        return message + (
            f"; not yet from {_plural('replica', pending)}" if pending else "; no other replica is registered"
        )

    def read(self, names: Sequence[str] | None = None) -> tuple[int, dict[str, tuple[int, np.ndarray]]]:
        """``(global_step, {name: (version, value)})`` for ``names`` (``None``: all), one snapshot.

        The values are read-only views, not copies: the store copies a tensor
        on its next update instead, and only while a reader still holds it.

        Examples
        --------
        >>> spec = VariableSpec("w", np.dtype("float32"), (2,))
        >>> store = ParameterStore("job", [spec], {"w": np.ones(2, np.float32)}, OptimizerConfig(), TrainingConfig())
        >>> store.read(["w"])
        (0, {'w': (0, array([1., 1.], dtype=float32))})
        """
        wanted = list(self.specs) if names is None else list(names)
        unknown = [name for name in wanted if name not in self.specs]
        if unknown:
            raise ParameterServerError(
                f"job {self.job_id!r}: no variable {listed(unknown)} on this shard; "
                f"it holds {listed(self.specs) or 'no variables'}",
                "NOT_FOUND",
            )
        with self._lock:
            lend = self._table.lend
            return self._global_step, {name: (self._versions[name], lend(name)) for name in wanted}

    def note_rejected(self) -> None:
        """Count a request the server refused before it reached the store."""
        with self._lock:
            self._pushes_rejected += 1

    def stats(self) -> StoreStats:
        """The shard's counters, versions and replicas, one consistent snapshot."""
        with self._lock:
            return StoreStats(
                global_step=self._global_step,
                versions=dict(self._versions),
                pushes_applied=self._pushes_applied,
                pushes_stale=self._pushes_stale,
                pushes_rejected=self._pushes_rejected,
                updates=self._updates,
                replicas={rid: replica.stats(rid) for rid, replica in sorted(self._replicas.items())},
                steps_skipped=self._steps_skipped,
                last_skipped=self._last_skipped,
            )

    def state(self) -> StoreState:
        """The global step, versions, variables and slots as they stand (read-only views): what a checkpoint saves."""
        with self._lock:
            return self._lend_state()

    def _lend_state(self) -> StoreState:
        return StoreState(self._global_step, dict(self._versions), self._table.lend_all())

    def load_state(self, state: StoreState, reason: str = "the shard was restored from a checkpoint") -> None:
        """Restore a checkpoint: checked completely first, so a bad one changes nothing.

        A sync step's pending gradients are discarded (they were computed from
        parameters the checkpoint replaces), and every call awaiting a step ends
        with ABORTED naming ``reason``: what it pushed was discarded with them.

        Examples
        --------
        >>> spec = VariableSpec("w", np.dtype("float64"), ())
        >>> store = ParameterStore("job", [spec], {"w": np.array(1.0)}, OptimizerConfig(), TrainingConfig())
        >>> store.load_state(StoreState(7, {"w": 7}, {"w": np.array(5.0)}))
        >>> store.read()
        (7, {'w': (7, array(5.))})
        """
        self._check_state(state)
        loaded = self._table.prepare(state.tensors)  # the copy, before the lock: pushes and pulls go on meanwhile
        with self._lock:
            self._table.install(loaded)  # the views handed out stay views of the tensors replaced
            self._versions = {name: int(state.versions[name]) for name in self.specs}
            self._global_step = int(state.global_step)
            self._discard_aggregation()
            self._snapshot = None  # copied from the state this one replaces
            self._lock.notify_all()
            self._waiters.abort(
                ParameterServerError(
                    f"{reason} (job {self.job_id!r}, global step {self._global_step}) while this call waited "
                    "for a later step; the gradients of the step in progress were discarded: register again, "
                    "pull, and go on from the restored step",
                    # ABORTED: the call was fine, a concurrent restore ended it; the client rejoins.
                    "ABORTED",
                )
            )

    def _check_state(self, state: StoreState) -> None:
        def refuse(problem: str) -> ParameterServerError:
            return ParameterServerError(f"checkpoint for job {self.job_id!r}: {problem}", "FAILED_PRECONDITION")

        if state.global_step < 0:
            raise refuse(f"global step {state.global_step} is negative")
        for label, found, expected in (
            ("tensors", state.tensors, self._shard.tensors),
            ("versions", state.versions, self.specs),
        ):
            problem = key_mismatch(label, found, expected)
            if problem:
                raise refuse(problem)
        for name, version in state.versions.items():
            if version < 0:
                raise refuse(f"version {version} of {name!r} is negative")
        for key in self._shard.tensors:
            what = f"checkpoint for job {self.job_id!r}: {key!r}"
            self._shard.check_tensor(what, state.tensors[key], key, "the shard holds", "FAILED_PRECONDITION")
