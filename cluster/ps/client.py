"""``ParameterClient``: one job's view of all its parameter-server shards.

A client talks to every shard in parallel (one thread per shard), puts the
pieces of a split variable back together (it pulls and pushes it as one
tensor), and knows the job's layout, its pull plans and its rules. How a
call reaches the shards (channels per process, retries with backoff while a
server is UNAVAILABLE, one deadline, the first failing shard ending a call
at once) is ``ShardCalls``'s (shard_calls.py).

Examples
--------
>>> import numpy as np
>>> from cellgraph.cluster.ps import ParameterClient, OptimizerConfig, create_server
>>> servers = [create_server("127.0.0.1:0", token="t0k3n") for _ in range(2)]
>>> client = ParameterClient([f"127.0.0.1:{port}" for _, port in servers], token="t0k3n")
>>> client.init("job", {"w": np.ones((4, 2), np.float32)}, OptimizerConfig("sgd", learning_rate=0.5))
0
>>> client.register(0).global_step
0
>>> client.push({"w": np.ones((4, 2), np.float32)}, step=0, replica_id=0).status
'applied'
>>> client.pull().values["w"][0]
array([0.5, 0.5], dtype=float32)
>>> client.close(); [server.stop(None).wait() for server, _ in servers]
[True, True]
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Iterator, Mapping, Sequence

import numpy as np

from cellgraph.dataflow.placement import Placement
from cellgraph.protos import parameter_service_pb2 as pb
from cellgraph.protos import parameter_service_pb2_grpc as pb_grpc

from .config import OptimizerConfig, TrainingConfig, VariableSpec
from .fanout import Cancelled, current_fan_out
from .frames import Framed, tensor_chunk_frames
from .held import PullPlan, StepCancelled
from .messages import (
    optimizer_from_proto,
    optimizer_to_proto,
    spec_from_proto,
    spec_to_proto,
    training_from_proto,
    training_to_proto,
)
from .nonfinite import first_nonfinite
from .results import JobInfo, PullResult, PushResult, push_result
from .shard_calls import ShardCalls
from .sharding import Layout, job_layout
from .step_parts import PlanKey, pull_plan, pull_result, push_pieces
from .step_requests import step_frames
from .streaming import StreamedStep

_PUSH_CHUNK_FIELD = pb.PushMessage.DESCRIPTOR.fields_by_name["chunk"].number
_INIT_CHUNK_FIELD = pb.InitMessage.DESCRIPTOR.fields_by_name["chunk"].number


# The protocol's fields (parameter_service.proto): protobuf raised a bare ValueError past them, naming no argument.
_REPLICA_IDS = (0, 2**31 - 1)  # int32 replica_id
_STEPS = (0, 2**63 - 1)  # int64 step and min_step; a server refuses a negative step


def _in_range(name: str, value: int | None, bounds: tuple[int, int]) -> None:
    """Refuse ``value`` (``None`` passes) unless it is an int in ``bounds``, naming ``name`` and the range."""
    low, high = bounds
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not low <= value <= high:
        raise ValueError(f"{name} {value!r} is out of range: it must be an int in [{low}, {high}]")


class ParameterClient(ShardCalls):
    """A client of one job's parameter servers (shard ``i`` at ``addresses[i]``).

    Parameters
    ----------
    addresses
        ``host:port`` of each shard, in shard order.
    token
        The job's token, sent with every call (``None`` only for a server
        started with ``token=None``).
    tls
        Certificates to reach TLS servers; plain TCP when ``None``.
    timeout
        Deadline of each call, in seconds, retries included.
    retries
        Attempts at a call that finds a server UNAVAILABLE, backing off
        exponentially from ``backoff`` seconds (doubling, at most 2 s).
    max_chunk_bytes
        The most tensor bytes one chunk carries.
    """

    # The job as this client knows it, set by init, register and job (the constructor is ShardCalls's).
    layout: Layout | None = None
    training: TrainingConfig | None = None

    @functools.cached_property
    def _plans(self) -> dict[PlanKey, PullPlan]:
        """Pull plans kept for reuse, by what they pull and into which arrays (a replica's step after step);
        dropped when the layout changes."""
        return {}

    @functools.cached_property
    def _order(self) -> dict[str, int]:
        """Each variable's place in the layout (``layout_order``); dropped when the layout changes."""
        return {}

    @functools.cached_property
    def _homes(self) -> dict[str, tuple[int, VariableSpec]]:
        """The shard and spec of each variable held whole by one shard (``whole_homes``); dropped when the layout
        changes."""
        return {}

    def _need_layout(self) -> Layout:
        if self.layout is None:
            self.job()
        assert self.layout is not None
        return self.layout

    # ------------------------------------------------------------------ job setup
    def init(
        self,
        job_id: str,
        variables: Mapping[str, np.ndarray],
        optimizer: OptimizerConfig | None = None,
        training: TrainingConfig | None = None,
        *,
        placement: Placement | None = None,
        split_threshold: int | None = None,
        moving: Mapping[str, float] | Collection[str] = (),
    ) -> int:
        """Give every shard its part of the job and its initial values; return the global step.

        The layout comes from ``placement`` when given (``ps`` task ``i`` is
        shard ``i``), else variables are spread greedily by bytes. Calling it
        again for the same job (a restarted client) leaves the values alone.
        The variables named in ``moving`` are moving statistics (batch norm's),
        each with its momentum when ``moving`` maps names to momenta (else 0):
        a push carries the value each moves towards, and the servers set it to
        ``momentum * itself + (1 - momentum) * that value`` (the mean of a
        step's values, in sync mode), with no optimizer and no slots.
        """
        optimizer, training = optimizer or OptimizerConfig(), training or TrainingConfig()
        # np.ascontiguousarray would make a 0-d array 1-d; asarray(order="C") keeps a scalar a scalar.
        arrays = {name: np.asarray(value, order="C") for name, value in variables.items()}
        layout = job_layout(job_id, arrays, len(self.addresses), training, placement, split_threshold, moving)
        used = {shard for pieces in layout.values() for shard, _ in pieces}
        shard_map = [
            pb.ShardMapEntry(shard=s, variable=spec_to_proto(spec)) for pieces in layout.values() for s, spec in pieces
        ]

        def messages(shard: int) -> Iterator[pb.InitMessage | bytes]:
            mine = [(spec, arrays[spec.name]) for pieces in layout.values() for s, spec in pieces if s == shard]
            yield pb.InitMessage(
                config=pb.JobConfig(
                    job_id=job_id,
                    shard=shard,
                    num_shards=len(self.addresses),
                    variables=[spec_to_proto(spec) for spec, _ in mine],
                    shard_map=shard_map,
                    optimizer=optimizer_to_proto(optimizer),
                    training=training_to_proto(training),
                )
            )
            for spec, value in mine:
                rows = value[spec.rows[0] : spec.rows[1]] if spec.shape != spec.whole_shape and spec.rows else value
                yield from tensor_chunk_frames(spec.name, rows, self.max_chunk_bytes, field=_INIT_CHUNK_FIELD)

        def init_shard(shard: int) -> int:
            call = lambda stub, left: stub.Init(messages(shard), timeout=left, metadata=self._metadata)
            return int(self._call(shard, f"Init of job '{job_id}'", call).global_step)

        steps = self._each_shard(sorted(used), init_shard)
        self.layout, self.training = layout, training
        self._plans.clear()
        self._order.clear()
        self._homes.clear()
        return min(steps.values())

    def register(self, replica_id: int, timeout: float | None = None) -> JobInfo:
        """Join the job as replica ``replica_id`` on every shard; learn its variables and rules (within ``timeout``,
        by default the client's)."""
        _in_range("replica_id", replica_id, _REPLICA_IDS)
        request = pb.RegisterRequest(replica_id=replica_id)
        return self._register(request, f"Register of replica {replica_id}", timeout)

    def job(self) -> JobInfo:
        """Learn the job's variables, layout and rules without joining it as a replica."""
        return self._register(pb.RegisterRequest(observer=True), "Register of an observer")

    def _register(self, request: pb.RegisterRequest, what: str, timeout: float | None = None) -> JobInfo:
        def register_shard(shard: int) -> pb.RegisterResponse:
            call = lambda stub, left: stub.Register(request, timeout=left, metadata=self._metadata)
            return self._call(shard, what, call, timeout=timeout)

        answers = self._each_shard(range(len(self.addresses)), register_shard)
        first = answers[0]
        layout: Layout = {}
        for entry in first.shard_map:
            spec = spec_from_proto(entry.variable)
            layout.setdefault(spec.name, []).append((entry.shard, spec))
        for pieces in layout.values():
            pieces.sort(key=lambda p: p[1].rows or (0, 0))
        self.layout, self.training = layout, training_from_proto(first.training)
        self._plans.clear()
        self._order.clear()
        self._homes.clear()
        return JobInfo(
            job_id=first.job_id,
            global_step=min(a.global_step for a in answers.values()),
            layout=layout,
            training=self.training,
            optimizer=optimizer_from_proto(first.optimizer),
        )

    # ------------------------------------------------------------------ pull / push
    def pull(
        self,
        names: Sequence[str] | None = None,
        *,
        min_step: int | None = None,
        timeout: float | None = None,
        replica_id: int = 0,
        out: Mapping[str, np.ndarray] | None = None,
    ) -> PullResult:
        """The whole value of each named variable (all when ``names`` is None).

        With ``min_step``, each shard answers once its global step reaches it
        (sync replicas wait for the step they pushed to be applied); the wait
        is bounded by ``timeout`` (default: the client's). ``out`` maps
        variable names to arrays to write into instead of new ones (a replica
        reuses its buffers step after step): each a writable C-contiguous
        array of the variable's dtype and whole shape.
        """
        _in_range("replica_id", replica_id, _REPLICA_IDS)
        _in_range("min_step", min_step, _STEPS)
        plan = self._pull_plan(names, replica_id, out)
        answers = self._each_shard(
            sorted(plan.requests),
            lambda shard: self._step(
                shard, [], None, plan, f"Pull of {', '.join(plan.names[shard])}", timeout, min_step=min_step
            ),
        )
        return pull_result(plan, {s: a[1] for s, a in answers.items() if a[1] is not None})

    def push(self, grads: Mapping[str, np.ndarray], *, step: int, replica_id: int) -> PushResult:
        """Send replica ``replica_id``'s gradients for ``step`` to every shard that holds their variables."""
        _in_range("replica_id", replica_id, _REPLICA_IDS)
        _in_range("step", step, _STEPS)
        pieces = self._push_pieces(grads)
        checked = self.watches_nonfinite(len(pieces))
        header = pb.PushHeader(replica_id=replica_id, step=step, checked=checked)
        what = f"Push of replica {replica_id} for step {step}"
        nonfinite = self._nonfinite(replica_id, step, grads) if checked else ""
        answers = self._each_shard(
            sorted(pieces), lambda shard: self._step(shard, pieces[shard], header, None, what, None, nonfinite)
        )
        return push_result({s: a[0] for s, a in answers.items() if a[0] is not None})

    def push_pull(
        self,
        grads: Mapping[str, np.ndarray],
        *,
        step: int,
        replica_id: int,
        min_step: int | None = None,
        names: Sequence[str] | None = None,
        timeout: float | None = None,
        out: Mapping[str, np.ndarray] | None = None,
    ) -> tuple[PushResult, PullResult]:
        """``push`` then ``pull``: one step on each shard's held stream, one round trip.

        A sync replica passes ``min_step=step + 1`` to get the parameters of
        the update its gradient joined.
        """
        _in_range("replica_id", replica_id, _REPLICA_IDS)
        _in_range("step", step, _STEPS)
        _in_range("min_step", min_step, _STEPS)
        pieces = self._push_pieces(grads)
        plan = self._pull_plan(names, replica_id, out)
        checked = self.watches_nonfinite(len(pieces))
        header = pb.PushHeader(replica_id=replica_id, step=step, checked=checked)
        what = f"push and pull of replica {replica_id} for step {step}"
        nonfinite = self._nonfinite(replica_id, step, grads) if checked else ""
        answers = self._each_shard(
            sorted(set(pieces) | set(plan.requests)),
            lambda shard: self._step(
                shard,
                pieces.get(shard, []),
                header if shard in pieces else None,
                plan,
                what,
                timeout,
                nonfinite,
                min_step,
            ),
        )
        pushed = {s: a[0] for s, a in answers.items() if a[0] is not None}
        pulled = {s: a[1] for s, a in answers.items() if a[1] is not None}
        return push_result(pushed), pull_result(plan, pulled)

    def start_step(
        self,
        *,
        step: int,
        replica_id: int,
        min_step: int | None = None,
        names: Sequence[str] | None = None,
        timeout: float | None = None,
        out: Mapping[str, np.ndarray] | None = None,
    ) -> StreamedStep:
        """A ``push_pull`` whose gradients are handed over one by one as they are computed, each sent at once
        while the caller computes the rest (``StreamedStep.push``, then ``finish``; streaming.py)."""
        _in_range("replica_id", replica_id, _REPLICA_IDS)
        _in_range("step", step, _STEPS)
        _in_range("min_step", min_step, _STEPS)
        timeout = self.timeout if timeout is None else timeout
        return StreamedStep(self, step, replica_id, min_step, names, out, timeout)

    def _step(
        self,
        shard: int,
        pieces: list[tuple[VariableSpec, np.ndarray]],
        header: pb.PushHeader | None,
        plan: PullPlan | None,
        what: str,
        timeout: float | None,
        nonfinite: str = "",
        min_step: int | None = None,
    ) -> tuple[pb.PushResponse | None, tuple[int, dict[str, int]] | None]:
        """One step on ``shard``'s held Step stream: the push (if any), then the pull (if ``plan`` asks this shard,
        answered once the shard reaches ``min_step``); ``nonfinite``: what ``_nonfinite`` found wrong with the
        push."""
        request = plan.requests.get(shard) if plan is not None else None

        def call(
            stub: pb_grpc.ParameterServiceStub, left: float
        ) -> tuple[pb.PushResponse | None, tuple[int, dict[str, int]] | None]:
            # The server gives up on a step a little before the caller does, to say whom it waited for.
            wire = plan.wire_for(shard, min_step) if plan is not None and request is not None else None
            frames = step_frames(pieces, header, wire, 0.9 * left, self.max_chunk_bytes, nonfinite)
            pool = self._pools[shard]
            stream = pool.take(self._metadata)
            receiver = plan.receiver(shard) if plan is not None and request is not None else None
            answered: list[pb.PushResponse] = []

            def on_answer(framed: Framed[pb.StepResponse]) -> None:  # on the step loop, as each message arrives
                if framed.message.HasField("push"):
                    answered.append(framed.message.push)
                if receiver is not None and framed.message.values:
                    receiver.add(framed, framed.message.values)

            try:
                stream.step(frames, on_answer, left, current_fan_out())
            except StepCancelled:
                raise Cancelled() from None  # another shard failed: its error is the news
            finally:
                pool.give_back(stream)
            pushed = answered[0] if answered else None
            return pushed, receiver.finish() if receiver is not None else None

        # An async push that reached the server before the connection broke may have been applied: retrying
        # could apply it twice. A sync push is safe to retry: the server refuses a second one for the same step.
        return self._call(shard, what, call, retry=header is None or self._sync(), timeout=timeout)

    # ------------------------------------------------------------------ pull and push, per shard
    def _pull_plan(
        self, names: Sequence[str] | None, replica_id: int, out: Mapping[str, np.ndarray] | None
    ) -> PullPlan:
        """A pull's plan, the kept one for the same arrays (step_parts.py)."""
        return pull_plan(self._need_layout(), names, replica_id, self.max_chunk_bytes, out, self._plans)

    def layout_order(self) -> dict[str, int]:
        """Each variable's place in the layout: the order of every shard's variables, in which a shard keeps
        its small ones side by side (tensor_table.py), so a push sends them fused in that order."""
        if not self._order:
            self._order.update((name, i) for i, name in enumerate(self._need_layout()))
        return self._order

    def whole_homes(self) -> dict[str, tuple[int, VariableSpec]]:
        """Where each variable held whole by one shard lives: (shard, spec). A streamed step sends such a
        variable's gradient there without cutting it into pieces (``StreamedStep.push``)."""
        if not self._homes:
            self._homes.update((name, pieces[0]) for name, pieces in self._need_layout().items() if len(pieces) == 1)
        return self._homes

    def _push_pieces(self, grads: Mapping[str, np.ndarray]) -> dict[int, list[tuple[VariableSpec, np.ndarray]]]:
        """Each shard's part of a push (step_parts.py)."""
        return push_pieces(self._need_layout(), grads)

    def watches_nonfinite(self, shards: int) -> bool:
        """Whether a push to ``shards`` shards is checked here for NaN and Inf (``PushHeader.checked``): when it
        spans more than one, since each sees only its own variables, unless the job applies them anyway. The
        shards then leave the check to this client."""
        return shards > 1 and not (self.training is not None and self.training.nonfinite == "apply")

    @staticmethod
    def _nonfinite(replica_id: int, step: int, grads: Mapping[str, np.ndarray]) -> str:
        """What is wrong with the first gradient of a push that holds NaN or Inf, or "": every shard is told,
        so that all skip or refuse the push alike (nonfinite.py)."""
        return first_nonfinite(replica_id, step, grads.items()) or ""

    def _sync(self) -> bool:
        return self.training is not None and self.training.mode == "sync"
