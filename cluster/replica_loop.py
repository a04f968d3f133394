"""A replica's training loop: compute, send each gradient while backprop goes on, pull while the next step runs.

One step of a replica:

1. compute the loss and the gradients on the values of the global step the
   replica holds, handing each gradient to the step's held streams the moment
   backprop has produced it (``StreamedStep.push``);
2. send the step's last message to each shard (``send_last``): the pull,
   which the shard answers once the push is applied (sync: once the step's
   update is made);
3. start the next step at once, while that answer is still arriving into the
   same buffers: its forward pass waits for each variable just before the
   first kernel that reads it (``Plan.stream_gated``), so that the first
   layers compute while the last layers' values are on the wire;
4. at the next step's first gradient, settle the previous step (its push's
   outcome, the global step its pull reached, which tags the new gradients).

The baseline (``overlap=False``) sends every gradient after the backward pass
and waits for the whole answer before computing again. The step before the
job's last is settled before computing too: the answer may end the job.

A settled step that failed (a server restored or lost) makes the replica
rejoin, as before; the step computed meanwhile is dropped (``_Restart``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from cellgraph.dataflow.errors import CellgraphError

from .errors import ParameterServerError
from .ps.results import PullResult
from .ps.streaming import StreamedStep
from .training_graph import LoadedGraph, TrainingError

if TYPE_CHECKING:
    from .replica import ReplicaSpec, StopSignal, _Batches, _Link, _Meter


@contextmanager
def naming(spec: ReplicaSpec, what: str) -> Iterator[None]:
    """Put the replica's name in front of a parameter-server error (the client's message names the server).

    >>> from types import SimpleNamespace
    >>> try:
    ...     with naming(SimpleNamespace(name="replica 1 of job 'j'"), "step 7"):
    ...         raise ParameterServerError("shard 0 was restored", "ABORTED")
    ... except ParameterServerError as err:
    ...     print(err, err.code)
    replica 1 of job 'j', step 7: shard 0 was restored ABORTED
    """
    try:
        yield
    except ParameterServerError as err:
        raise ParameterServerError(f"{spec.name}, {what}: {err}", err.code) from err


class _Restart(Exception):
    """The previous step's answer moved the replica: it rejoined (``pulled``), or ``stop`` was set (None)."""

    def __init__(self, pulled: PullResult | None) -> None:
        super().__init__("restart")
        self.pulled = pulled


class _Finished(Exception):
    """The previous step's answer reached the job's last step: the step being computed is not needed."""


@dataclass
class _Sent:
    """A step whose gradients are all sent; its answer (the pull) arrives into the values the next step reads."""

    streamed: StreamedStep
    step: int
    began: float  # perf_counter when its compute began
    computed: float  # perf_counter when its last message was sent
    loss: float
    grad_bytes: int


class TrainingLoop:
    """The pull-compute-push loop of one replica (see the module)."""

    def __init__(
        self,
        spec: ReplicaSpec,
        loaded: LoadedGraph,
        batches: _Batches,
        link: _Link,
        meter: _Meter,
        stop: StopSignal | None,
    ) -> None:
        self.spec = spec
        self.loaded = loaded
        self.batches = batches
        self.link = link
        self.meter = meter
        self.stop = stop
        self.sync = spec.mode == "sync"
        self.step = 0
        self.values: dict[str, np.ndarray] = {}
        self.sent: _Sent | None = None  # the last step, its answer still arriving
        self.streamed: StreamedStep | None = None  # the step being computed, once it sent a gradient
        self.began = 0.0  # perf_counter when the step being computed began
        self.began_at = 0.0  # the same moment in time.monotonic, the clock of StreamedStep's times

    def run(self, pulled: PullResult) -> bool:
        """Train from ``pulled`` until the job's last step; True if ``stop`` ended it."""
        self.step, self.values = pulled.global_step, dict(pulled.values)
        # Joining at global step g, the replica takes batch g of its stream: a job resumed from a checkpoint goes
        # on with the data where a run that never stopped would be, instead of with its shard's first batches.
        self.batches.seek(self.step)
        self.meter.start(self.step)
        while True:
            try:
                if self.sent is not None and not self._may_prefetch():
                    self._settle()
                if self.stop is not None and self.stop.is_set():
                    self._settle_last()
                    return True
                if self.sent is None and self.step >= self.spec.steps:
                    return False
                self._compute_and_send()
            except _Finished:
                return False
            except _Restart as restart:
                self.sent = None
                if restart.pulled is None:
                    return True
                self.step, self.values = restart.pulled.global_step, dict(restart.pulled.values)
                self.batches.seek(self.step)  # rejoined (servers restored, say): that step's batch, as at a join

    def _may_prefetch(self) -> bool:
        """Whether the next step may start before the last one's answer: not in the baseline, and not when the
        answer may be the job's last step (then nothing is computed after it)."""
        assert self.sent is not None
        return self.spec.overlap and self.sent.step + 1 < self.spec.steps

    # ------------------------------------------------------------------ one step
    def _compute_and_send(self) -> None:
        spec = self.spec
        self.began, self.began_at, self.streamed = time.perf_counter(), time.monotonic(), None
        try:
            if spec.overlap:
                wait = self._wait if self.sent is not None else None
                loss, grads = self.loaded.compute(self.values, self.batches.next(), on_gradient=self._push, wait=wait)
            else:  # the baseline: every gradient leaves after the backward pass
                loss, grads = self.loaded.compute(self.values, self.batches.next())
                for name, grad in grads.items():
                    self._push(name, grad)
            if self.streamed is None:  # no gradient at all (nothing trained): the step still pulls
                self._start()
            assert self.streamed is not None
            self.streamed.send_last()
        except BaseException as err:
            if self.streamed is not None:
                self.streamed.abort()  # whatever stopped the step (a KeyboardInterrupt too), its streams go back
            if isinstance(err, CellgraphError) and not isinstance(err, ParameterServerError):
                raise TrainingError(f"{spec.name} failed computing step {self.step}: {err}") from err
            raise
        grad_bytes = sum(g.nbytes for g in grads.values())
        sent = _Sent(self.streamed, self.step, self.began, time.perf_counter(), loss, grad_bytes)
        self.sent, self.streamed = sent, None

    def _push(self, name: str, grad: np.ndarray) -> None:
        if self.streamed is None:
            self._start()
        assert self.streamed is not None
        self.streamed.push(name, grad)

    def _start(self) -> None:
        """Begin sending this step: the last one settled first, since its global step tags these gradients."""
        if self.sent is not None:
            self._settle()
        if self.step >= self.spec.steps:  # the last answer reached the job's last step (async: others pushed too)
            raise _Finished()
        self.streamed = self.link.client.start_step(
            step=self.step,
            replica_id=self.spec.replica_id,
            min_step=self.step + 1 if self.sync else None,
            names=self.spec.graph.pulled,
            out=self.values,
        )

    def _wait(self, name: str) -> None:
        """Hold the step being computed until ``name``'s value from the last step's pull has arrived."""
        sent = self.sent
        if sent is not None and not sent.streamed.wait_for(name):
            self._settle()  # the last step failed: settling says how (a rejoin restarts the loop)

    # ------------------------------------------------------------------ settling
    def _settle(self) -> None:
        """The last step's answer: record it, and hold the global step and values it brought."""
        sent = self.sent
        assert sent is not None
        self.sent = None
        spec, prefetching = self.spec, self.began > sent.began  # the step being computed began after it
        staleness, overlap, failed = 0, 0.0, False
        settling = time.perf_counter()
        try:
            with naming(spec, f"step {sent.step}"):
                result = sent.streamed.result(next_started=self.began_at if prefetching else None)
            pulled, staleness, overlap = result.pulled, result.pushed.staleness, result.overlap
        except ParameterServerError as err:
            pulled, failed = self._after_failed(err, sent.step), True
        self.link.rejoins_in_row = 0
        self.step, self.values = pulled.global_step, dict(pulled.values)
        # The step's own time: computing and sending it, then waiting for its answer (the next step's waits for
        # values included when it started early); not the gaps between steps.
        if prefetching:
            waited = time.perf_counter() - settling + sent.streamed.arrivals.waited_s
            seconds = sent.computed - sent.began + waited
        else:
            seconds = time.perf_counter() - sent.began
        traffic = sent.grad_bytes + sum(v.nbytes for v in pulled.values.values())
        self.meter.record(self.step, sent.loss, seconds, staleness, traffic, overlap)
        if failed and prefetching:  # the step being computed read values of an answer that failed: compute again
            raise _Restart(pulled)

    def _after_failed(self, err: ParameterServerError, step: int) -> PullResult:
        """What a failed step leaves the replica with; raises ``_Restart`` when it had to rejoin."""
        spec = self.spec
        if err.code == "ALREADY_EXISTS":
            # This replica's gradient for this step was counted already (a push retried after its answer was
            # lost, or a rerun replica's second push): wait for the step like any other pusher.
            try:
                with naming(spec, f"step {step}"):
                    return self.link.client.pull(
                        spec.graph.pulled, min_step=step + 1, replica_id=spec.replica_id, out=self.values
                    )
            except ParameterServerError as waited:
                err = waited
        # The job hears the last step this replica reached before it waits for the servers: a restarted server's
        # event counts the steps lost from it (the job's own look at the servers may be a second or more behind).
        self.meter.flush()
        raise _Restart(self.link.rejoin(err, step, self.stop))

    def _settle_last(self) -> None:
        """``stop`` was set: count the last step sent, if its answer comes (its push was sent either way)."""
        if self.sent is not None:
            try:
                self._settle()
            except (ParameterServerError, _Restart):
                pass  # stopping: the servers' troubles are the next run's news
