"""One parameter-server shard's state: its variables, their optimizer slots and versions, the global step.

A ``ParameterStore`` holds that state, the replicas registered, and the calls
waiting for a later step, behind one lock. What a push does to it (refused,
stale, summed into the sync step, applied) is decided by its ``PushRules``
(``push_rules.py``), under the same lock. It knows nothing of gRPC: the
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

import numpy as np

from ..errors import ParameterServerError
from .config import OptimizerConfig, TrainingConfig, VariableSpec
from .pieces import Gradient
from .push_rules import PushRules, Taken
from .records import PushOutcome, Replica, StoreState, StoreStats
from .shard_layout import ShardLayout
from .shard_updates import Fused
from .step_waiters import StepWaiters, check_timeout
from .tensor_table import TensorTable


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
        self._shard = ShardLayout(specs, optimizer)
        self.specs = self._shard.specs
        self._shard.check_initial(initial)

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
        # What a push does: its checks, the sync step in progress, the arithmetic, the counters (push_rules.py).
        self._rules = PushRules(job_id, self._shard, self._table, optimizer, training)
        self._versions = dict.fromkeys(self.specs, 0)
        self._global_step = 0
        self._replicas: dict[int, Replica] = {}
        self._snapshot: StoreState | None = None  # see take_snapshot
        # Calls awaiting a later step (until_step): futures on the server's event loop, not threads.
        self._waiters = StepWaiters(self._lock)

    @property
    def training(self) -> TrainingConfig:
        """How pushes become updates (``reconfigure`` changes ``replicas_to_aggregate``)."""
        return self._rules.training

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
            taken = self._rules.take(
                self._replicas, self._global_step, replica_id, step, grads, finite, reported, fused
            )
            return self._settle(taken)

    def _settle(self, taken: Taken) -> PushOutcome:
        """Advance the versions and the global step as a push (or a reconfigure) says; under the lock."""
        if taken.update:
            versions = self._versions
            for name in versions:
                versions[name] += 1
        if taken.advance:
            self._advance()
        return PushOutcome(taken.status, self._global_step, taken.staleness)

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
            taken = self._rules.reconfigure(replicas_to_aggregate, self._global_step)
            if taken is not None:
                self._settle(taken)
            return self._global_step

    def slot_nbytes(self, name: str) -> int:
        """Bytes of variable ``name``'s optimizer slots on this shard."""
        return sum(self._table.nbytes(f"{name}/{slot}") for slot in self._shard.slots_of[name])

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
        return self._rules.waiting_message(step, timeout, self._global_step, self._replicas)

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
        wanted = list(self.specs) if names is None else self._shard.check_names(names, self.job_id)
        with self._lock:
            lend = self._table.lend
            return self._global_step, {name: (self._versions[name], lend(name)) for name in wanted}

    def note_rejected(self) -> None:
        """Count a request the server refused before it reached the store."""
        with self._lock:
            self._rules.rejected += 1

    def stats(self) -> StoreStats:
        """The shard's counters, versions and replicas, one consistent snapshot."""
        with self._lock:
            rules = self._rules
            return StoreStats(
                global_step=self._global_step,
                versions=dict(self._versions),
                pushes_applied=rules.applied,
                pushes_stale=rules.stale,
                pushes_rejected=rules.rejected,
                updates=rules.updates,
                replicas={rid: replica.stats(rid) for rid, replica in sorted(self._replicas.items())},
                steps_skipped=rules.steps_skipped,
                last_skipped=rules.last_skipped,
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
        self._shard.check_state(state, self.job_id)
        loaded = self._table.prepare(state.tensors)  # the copy, before the lock: pushes and pulls go on meanwhile
        with self._lock:
            self._table.install(loaded)  # the views handed out stay views of the tensors replaced
            self._versions = {name: int(state.versions[name]) for name in self.specs}
            self._global_step = int(state.global_step)
            self._rules.discard()
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
