"""The parameter service's RPCs over one shard's store.

The servicer's methods are named exactly as the RPCs of
``protos/parameter_service.proto``. Each one checks its request at the door
(names, dtypes, shapes, chunk offsets, sizes, the replica and the step) and
refuses a bad one with a status code and a message naming the variable and
what was wrong, before anything changes: a push is assembled completely into
its own buffers and only then handed to the store, which applies it or not as
a whole. ``server.py`` hosts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cellgraph.protos import parameter_service_pb2 as pb
from cellgraph.protos import parameter_service_pb2_grpc as pb_grpc
from cellgraph.protos import tensor_pb2

from ..errors import ParameterServerError
from . import checkpoint
from .auth import AsyncTokenAuthInterceptor
from .autosave import WRITTEN_WAIT_S, CheckpointWriter
from .checkpoint import CheckpointInfo
from .chunks import MAX_CHUNK_BYTES, MAX_MESSAGE_BYTES, TensorAssembler, release_all, tensor_chunks
from .config import SCALAR_SLOTS, SLOTS, listed, quoted
from .door import Context, Counters, available_memory, check_chunk_size, client_stream, refusing, refusing_stream
from .frames import Framed, tensor_chunk_frames
from .gradient_intake import take_gradient
from .messages import (
    optimizer_from_proto,
    optimizer_to_proto,
    spec_from_proto,
    training_from_proto,
    training_to_proto,
)
from .step_server import serve_steps
from .store import ParameterStore, StoreState

# A pull that waits for a step and carries no deadline of its own waits at most this long.
DEFAULT_MAX_WAIT_S = 300.0
# How many bytes of variables one server agrees to hold; more is RESOURCE_EXHAUSTED.
DEFAULT_MAX_BYTES = 64 * 1024**3
# How long an Init waits for another one in progress (one stalled client must not block the next forever).
DEFAULT_INIT_WAIT_S = 60.0
# A client stream (Init, Push) that sends nothing for this long is ended: a stalled client holds no buffer forever.
DEFAULT_STREAM_IDLE_S = 60.0
# A replica's Step stream silent this long between steps is ended (it holds no buffer then; the replica reopens it).
DEFAULT_HELD_IDLE_S = 3600.0
# How often an Init waiting for another one looks again whether it has finished.
INIT_POLL_S = 0.01
# The longest job id and checkpoint name taken: both are repeated in messages.
MAX_ID_CHARS = 200
# A replica's account of a non-finite gradient (StepRequest.nonfinite) is kept and shown up to this length.
MAX_REASON_CHARS = 1000

_PUSH_STATUS = {name.lower(): value for name, value in pb.PushResponse.Status.items()}
_PULL_CHUNK_FIELD = pb.PullMessage.DESCRIPTOR.fields_by_name["chunk"].number


class ParameterServicer(pb_grpc.ParameterServiceServicer):
    """One shard of one job: the RPCs of ``ParameterService`` over a ``ParameterStore``."""

    def __init__(
        self,
        *,
        checkpoint_dir: str | Path | None = None,
        keep_checkpoints: int = 5,
        max_chunk_bytes: int = MAX_CHUNK_BYTES,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_wait_s: float = DEFAULT_MAX_WAIT_S,
        init_wait_s: float = DEFAULT_INIT_WAIT_S,
        stream_idle_s: float = DEFAULT_STREAM_IDLE_S,
        held_idle_s: float = DEFAULT_HELD_IDLE_S,
        auth: AsyncTokenAuthInterceptor | None = None,
    ) -> None:
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None
        self.keep_checkpoints = keep_checkpoints
        self.max_chunk_bytes = max_chunk_bytes
        self.max_bytes = max_bytes
        self.max_wait_s = max_wait_s
        self.init_wait_s = init_wait_s
        self.stream_idle_s = stream_idle_s
        self.held_idle_s = held_idle_s
        self.auth = auth
        self.counters = Counters()
        self.store: ParameterStore | None = None
        self.job: pb.JobConfig | None = None
        # One Init at a time, waited for at most init_wait_s. A thread lock taken without blocking (_init_turn
        # polls it), so that waiting for it holds no thread and a cancelled wait can never leave it taken.
        self._init_lock = threading.Lock()
        self._init_holder: tuple[str, float] = ("", 0.0)  # the Init holding the lock: job id, monotonic start
        self._save_lock = threading.Lock()  # one Save or Restore at a time
        self._writer: CheckpointWriter | None = None  # the job's own checkpoints (checkpoint_every)
        self._latest: tuple[str, int] = ("", -1)  # the newest checkpoint written: name, global step
        self._written = 0  # checkpoints written for the job; the retention deletes old ones, so they are counted

    # ------------------------------------------------------------------ helpers
    def _job_store(self) -> tuple[pb.JobConfig, ParameterStore]:
        if self.store is None or self.job is None:
            raise ParameterServerError(
                "this parameter server holds no job yet: a client must call Init first", "FAILED_PRECONDITION"
            )
        return self.job, self.store

    def _checkpoint_dir(self) -> Path:
        if self.checkpoint_dir is None:
            raise ParameterServerError(
                "this parameter server has no checkpoint directory: start it with checkpoint_dir=... "
                "(`cellgraph ps --checkpoint-dir DIR`)",
                "FAILED_PRECONDITION",
            )
        return self.checkpoint_dir

    # ------------------------------------------------------------------ Init
    @refusing
    async def Init(self, request_iterator: AsyncIterator[pb.InitMessage], context: Context) -> pb.InitResponse:  # noqa: N802
        messages = client_stream(request_iterator, "Init", self.stream_idle_s)
        first = await anext(messages, None)
        if first is None or first.message.WhichOneof("kind") != "config":
            raise ParameterServerError("an Init stream must start with the job's config", "INVALID_ARGUMENT")
        config = first.message.config
        async with self._init_turn(config.job_id, context):
            if self.job is not None and self.store is not None:
                if self.job.SerializeToString(deterministic=True) != config.SerializeToString(deterministic=True):
                    other = "the same job id with a different config" if self.job.job_id == config.job_id else None
                    raise ParameterServerError(
                        f"this parameter server already holds job {quoted(self.job.job_id)}"
                        + (f" ({other})" if other else f"; job {quoted(config.job_id)} needs a server of its own"),
                        "FAILED_PRECONDITION",
                    )
                return pb.InitResponse(global_step=self.store.global_step, already_initialized=True)
            if config.training.checkpoint_every > 0:
                self._checkpoint_dir()  # a job that checkpoints by itself needs somewhere to write
            try:
                store = await self._build_store(config, messages)
            except MemoryError as err:  # the estimate of _check_memory was not enough: still the client's problem
                raise ParameterServerError(
                    f"job {quoted(config.job_id)} does not fit in this parameter server's memory ({err}); "
                    f"{available_memory() or 0:,} bytes are available now",
                    "RESOURCE_EXHAUSTED",
                ) from None
            if store.training.checkpoint_every > 0:
                self._writer = CheckpointWriter(
                    lambda state: self._write_checkpoint(config, store, state).name,
                    f"cellgraph-ps-checkpoints-{config.job_id}-{config.shard}",
                )
            self.store, self.job = store, config
            return pb.InitResponse(global_step=store.global_step)

    @contextlib.asynccontextmanager
    async def _init_turn(self, job_id: str, context: Context) -> AsyncIterator[None]:
        """Hold the Init lock, waiting for another Init at most ``init_wait_s`` (and within the caller's deadline)."""
        remaining = context.time_remaining()
        wait = self.init_wait_s if remaining is None else max(0.0, min(0.9 * remaining, self.init_wait_s))
        deadline = time.monotonic() + wait
        while not self._init_lock.acquire(blocking=False):
            if time.monotonic() >= deadline:
                holder, since = self._init_holder
                raise ParameterServerError(
                    f"waited {wait:g} s for another Init (of job {quoted(holder)}, in progress for "
                    f"{time.monotonic() - since:.1f} s) to finish; Init of job {quoted(job_id)} not started: "
                    "retry once that one has finished or failed",
                    "DEADLINE_EXCEEDED",
                )
            await asyncio.sleep(INIT_POLL_S)
        try:
            self._init_holder = (job_id, time.monotonic())
            yield
        finally:
            self._init_lock.release()

    async def _build_store(
        self, config: pb.JobConfig, messages: AsyncIterator[Framed[pb.InitMessage]]
    ) -> ParameterStore:
        if not config.job_id:
            raise ParameterServerError("the job config has no job_id", "INVALID_ARGUMENT")
        if len(config.job_id) > MAX_ID_CHARS:
            raise ParameterServerError(
                f"job id {quoted(config.job_id)} is longer than {MAX_ID_CHARS} characters", "INVALID_ARGUMENT"
            )
        if not 0 <= config.shard < config.num_shards:
            raise ParameterServerError(
                f"shard {config.shard} is not in [0, {config.num_shards}) (num_shards)", "INVALID_ARGUMENT"
            )
        job = quoted(config.job_id)
        specs = [spec_from_proto(v) for v in config.variables]
        if not specs:
            raise ParameterServerError(f"job {job} gives shard {config.shard} no variables", "INVALID_ARGUMENT")
        total = sum(s.nbytes for s in specs)
        if total > self.max_bytes:
            raise ParameterServerError(
                f"job {job} declares {total:,} bytes of variables for shard {config.shard}, "
                f"over this server's limit of {self.max_bytes:,}",
                "RESOURCE_EXHAUSTED",
            )
        for entry in config.shard_map:
            spec_from_proto(entry.variable)  # every entry must parse, though only ours are held
        optimizer, training = optimizer_from_proto(config.optimizer), training_from_proto(config.training)
        problem = training.layout_problem(len({entry.shard for entry in config.shard_map}))
        if problem:  # ParameterClient.init refuses it first; a client of its own is told here
            raise ParameterServerError(f"job {job}: {problem}", "INVALID_ARGUMENT")
        by_name = {s.name: s for s in specs}
        if len(by_name) != len(specs):
            raise ParameterServerError("the job config names a variable twice", "INVALID_ARGUMENT")
        self._check_memory(job, config.shard, total, optimizer.kind, training.mode)
        # An assembler (and its array) is made when its variable's first chunk arrives, not on the declaration.
        assemblers: dict[str, TensorAssembler] = {}
        try:
            async for framed in messages:
                if framed.message.WhichOneof("kind") != "chunk":
                    raise ParameterServerError(
                        "an Init stream carries one config, then only chunks", "INVALID_ARGUMENT"
                    )
                [(chunk, content)] = framed.paired([framed.message.chunk])
                self._receive_initial(chunk, content, by_name, assemblers)
            for spec in specs:  # a variable no chunk arrived for: finish() names its missing bytes
                assemblers.setdefault(spec.name, TensorAssembler(spec, f"initial value of {quoted(spec.name)}"))
            initial = {s.name: assemblers[s.name].finish() for s in specs}
            return ParameterStore(config.job_id, specs, initial, optimizer, training)
        finally:
            # Refused, cancelled or done: the buffers go now, not when the cycle collector reaches this frame
            # (a cancelled call's traceback keeps it alive). The store holds copies of its own.
            release_all(assemblers)

    def _receive_initial(
        self,
        chunk: tensor_pb2.TensorChunk,
        content: memoryview,
        by_name: dict[str, Any],
        assemblers: dict[str, TensorAssembler],
    ) -> None:
        spec = by_name.get(chunk.name)
        if spec is None:
            raise ParameterServerError(
                f"initial value for {quoted(chunk.name)}, which is not a variable of this shard; "
                f"it holds: {listed(by_name, quote=False)}",
                "NOT_FOUND",
            )
        what = f"initial value of {quoted(chunk.name)}"
        check_chunk_size(content.nbytes, self.max_chunk_bytes, what)
        assembler = assemblers.get(spec.name)
        if assembler is None:
            # adopt: a whole tensor in one aligned chunk is used where it lies in the received bytes, no copy.
            assembler = assemblers[spec.name] = TensorAssembler(spec, what, adopt=True)
        assembler.add(chunk, content)
        self.counters.add(bytes_in=content.nbytes)

    def _check_memory(self, job: str, shard: int, variables: int, optimizer: str, mode: str) -> None:
        """Refuse a job whose shard would not fit in this machine's free memory, before allocating any of it."""
        available = available_memory()
        if available is None:
            return
        slots = [slot for slot in SLOTS[optimizer] if slot not in SCALAR_SLOTS[optimizer]]  # a scalar is no copy
        held = ["as received", "in the store"]
        held += [f"{optimizer} slot{'s' if len(slots) > 1 else ''} {' and '.join(slots)}"] if slots else []
        held += ["the sync step's sum"] if mode == "sync" else []
        copies = len(held) + len(slots) - bool(slots)
        needed = copies * variables
        if needed > available:
            listing = " and ".join(held) if len(held) == 2 else ", ".join(held[:-1]) + ", and " + held[-1]
            raise ParameterServerError(
                f"job {job} needs about {needed:,} bytes for shard {shard} ({variables:,} bytes of variables, "
                f"held {copies} times: {listing}), more than the {available:,} bytes of memory available on this "
                "machine: use more parameter servers, or a machine with more memory",
                "RESOURCE_EXHAUSTED",
            )

    # ------------------------------------------------------------------ Register
    @refusing
    async def Register(self, request: pb.RegisterRequest, context: Context) -> pb.RegisterResponse:  # noqa: N802
        job, store = self._job_store()
        step = store.global_step if request.observer else store.register(request.replica_id)
        return pb.RegisterResponse(
            job_id=job.job_id,
            global_step=step,
            shard=job.shard,
            num_shards=job.num_shards,
            variables=job.variables,
            shard_map=job.shard_map,
            training=training_to_proto(store.training),
            optimizer=optimizer_to_proto(store.optimizer),
        )

    # ------------------------------------------------------------------ Pull
    @refusing_stream
    async def Pull(self, request: pb.PullRequest, context: Context) -> AsyncIterator[bytes]:  # noqa: N802
        # Each response is a PullMessage serialized by hand (tensor_chunk_frames): one copy of the content.
        _, store = self._job_store()
        step, values, limit = await self.snapshot(store, request, wait_limit(context, self.max_wait_s))
        for name, (version, value) in values.items():
            head = pb.PullMessage(global_step=step, version=version).SerializeToString()
            for frame in tensor_chunk_frames(name, value, limit, field=_PULL_CHUNK_FIELD, head=head):
                yield frame
            self.counters.add(bytes_out=value.nbytes)

    async def snapshot(
        self, store: ParameterStore, request: pb.PullRequest, wait_s: float
    ) -> tuple[int, dict[str, tuple[int, np.ndarray]], int]:
        """The requested variables once ``min_step`` is reached (waiting at most ``wait_s``):
        (global step, read-only values, chunk size)."""
        names = list(request.names) or None
        if request.HasField("min_step"):
            await store.until_step(request.min_step, wait_s)
        step, values = store.read(names)
        limit = self.max_chunk_bytes
        if request.max_chunk_bytes > 0:
            limit = min(limit, request.max_chunk_bytes)
        return step, values, limit

    # ------------------------------------------------------------------ Push
    @refusing
    async def Push(self, request_iterator: AsyncIterator[pb.PushMessage], context: Context) -> pb.PushResponse:  # noqa: N802
        _, store = self._job_store()
        messages = client_stream(request_iterator, "Push", self.stream_idle_s)
        first = await anext(messages, None)
        if first is None or first.message.WhichOneof("kind") != "header":
            raise ParameterServerError("a Push stream must start with a header (replica_id, step)", "INVALID_ARGUMENT")
        header = first.message.header

        assemblers: dict[str, TensorAssembler] = {}
        try:
            async for framed in messages:
                if framed.message.WhichOneof("kind") != "chunk":
                    raise ParameterServerError(
                        f"replica {header.replica_id}'s push for step {header.step} has a second header; "
                        "a Push stream carries one header, then only chunks",
                        "INVALID_ARGUMENT",
                    )
                [(chunk, content)] = framed.paired([framed.message.chunk])
                self.receive_gradient(store, header, chunk, content, assemblers)
            await self.before_push(store, wait_limit(context, self.max_wait_s))
            return self.push(store, header, assemblers)
        finally:
            release_all(assemblers)

    def receive_gradient(
        self,
        store: ParameterStore,
        header: pb.PushHeader,
        chunk: tensor_pb2.TensorChunk,
        content: memoryview,
        assemblers: dict[str, TensorAssembler],
    ) -> None:
        """Take one chunk of a push at this server's chunk limit, and count its bytes (gradient_intake.py)."""
        self.counters.add(bytes_in=take_gradient(store, header, chunk, content, assemblers, self.max_chunk_bytes))

    async def before_push(self, store: ParameterStore, wait_s: float) -> None:
        """Wait until the checkpoint of the current global step, if one is being written, is on disk: a push
        must not move the step past it first (autosave.py). At most ``wait_s`` (within the caller's deadline):
        then the push goes on, and the writer's error says the checkpoint was late."""
        if self._writer is not None:
            await self._writer.before_push(store.global_step, min(wait_s, WRITTEN_WAIT_S))

    def push(
        self,
        store: ParameterStore,
        header: pb.PushHeader,
        assemblers: dict[str, TensorAssembler],
        nonfinite: str = "",
    ) -> pb.PushResponse:
        """Hand a whole push, every gradient assembled, to the store; ``nonfinite``: what the replica found wrong
        with a gradient of this step on any shard (a Step's last message says it; cut to a readable length)."""
        grads = {name: a.gradient() for name, a in assemblers.items()}  # a big one as its chunks lie
        finite = {name for name, a in assemblers.items() if a.finite}
        fused = dict(a.fused_with for a in assemblers.values() if a.fused_with is not None)
        outcome = store.push(header.replica_id, header.step, grads, finite, nonfinite[:MAX_REASON_CHARS], fused)
        self._checkpoint_if_due(store)
        return pb.PushResponse(
            status=_PUSH_STATUS[outcome.status],
            global_step=outcome.global_step,
            staleness=outcome.staleness,
        )

    # ------------------------------------------------------------------ PushPull
    @refusing
    async def PushPull(self, framed: Framed[pb.PushPullRequest], context: Context) -> pb.PushPullResponse:  # noqa: N802
        _, store = self._job_store()
        request = framed.message
        if not request.HasField("header"):
            raise ParameterServerError("a PushPull request needs a header (replica_id, step)", "INVALID_ARGUMENT")
        response = pb.PushPullResponse()
        assemblers: dict[str, TensorAssembler] = {}
        try:
            for chunk, content in framed.paired(request.chunks):
                self.receive_gradient(store, request.header, chunk, content, assemblers)
            await self.before_push(store, 0.5 * wait_limit(context, self.max_wait_s))  # the pull waits too
            response.push.CopyFrom(self.push(store, request.header, assemblers))
        finally:
            release_all(assemblers)
        step, values, limit = await self.snapshot(store, request.pull, wait_limit(context, self.max_wait_s))
        for name, (version, value) in values.items():
            for message in tensor_chunks(name, value, limit, response.values.add):
                message.global_step, message.version = step, version
            self.counters.add(bytes_out=value.nbytes)
        size = response.ByteSize()
        if size > MAX_MESSAGE_BYTES:
            raise ParameterServerError(
                f"the {len(response.values)} chunks of the pull after replica {request.header.replica_id}'s push make a "
                f"{size:,}-byte answer, over the {MAX_MESSAGE_BYTES:,}-byte message limit; the push was taken: "
                "pull these variables with Pull",
                "RESOURCE_EXHAUSTED",
            )
        return response

    # ------------------------------------------------------------------ Step
    @refusing_stream
    async def Step(self, request_iterator: AsyncIterator[Any], context: Context) -> AsyncIterator[bytes]:  # noqa: N802
        # A replica's held stream: step after step of pushes and pulls (step_server.py).
        _, store = self._job_store()
        async for frame in serve_steps(self, store, request_iterator):
            yield frame

    # ------------------------------------------------------------------ Save / Restore
    @refusing
    async def Save(self, request: pb.SaveRequest, context: Context) -> pb.SaveResponse:  # noqa: N802
        job, store = self._job_store()
        self._checkpoint_dir()
        state = store.state()  # a consistent snapshot; training goes on while it is written
        # Written by a thread: the event loop goes on serving (health checks included) while the disk works.
        info = await asyncio.to_thread(self._write_checkpoint, job, store, state)
        nbytes = sum(t.nbytes for t in state.tensors.values())
        return pb.SaveResponse(checkpoint=info.name, global_step=state.global_step, bytes=nbytes)

    def _write_checkpoint(self, job: pb.JobConfig, store: ParameterStore, state: StoreState) -> CheckpointInfo:
        """Write ``state`` as this shard's checkpoint (one write at a time) and remember it as the latest."""
        with self._save_lock:
            info = checkpoint.write_shard_checkpoint(
                self._checkpoint_dir(),
                job_id=job.job_id,
                shard=job.shard,
                num_shards=job.num_shards,
                global_step=state.global_step,
                tensors=state.tensors,
                versions=state.versions,
                specs=list(store.specs.values()),
                optimizer=store.optimizer,
                training=store.training,
                keep=self.keep_checkpoints,
            )
            self._written += 1
            if state.global_step >= self._latest[1]:
                self._latest = (info.name, state.global_step)
        return info

    def _checkpoint_if_due(self, store: ParameterStore) -> None:
        """Hand the state copied at a multiple of ``checkpoint_every`` (if any) to the background writer."""
        snapshot = store.take_snapshot()
        if snapshot is not None and self._writer is not None:
            self._writer.offer(snapshot)

    def stopping(self, address: str) -> None:
        """End every call awaiting a step with UNAVAILABLE: the server at ``address`` is stopping."""
        if self.store is not None:
            self.store.abort_waiters(
                f"parameter server {address} is stopping; this call's step will not be reached here", "UNAVAILABLE"
            )

    def close(self) -> None:
        """Let a background checkpoint in progress finish (the server is stopping)."""
        if self._writer is not None:
            self._writer.close()

    @refusing
    async def Restore(self, request: pb.RestoreRequest, context: Context) -> pb.RestoreResponse:  # noqa: N802
        job, store = self._job_store()
        directory = self._checkpoint_dir()
        if len(request.checkpoint) > MAX_ID_CHARS:
            raise ParameterServerError(
                f"checkpoint name {quoted(request.checkpoint)} is longer than {MAX_ID_CHARS} characters",
                "INVALID_ARGUMENT",
            )
        return await asyncio.to_thread(self._restore, job, store, directory, request.checkpoint)

    def _restore(self, job: pb.JobConfig, store: ParameterStore, directory: Path, name: str) -> pb.RestoreResponse:
        """Read a checkpoint and load it (a thread's work: reading is slow); waiters end with ABORTED."""
        with self._save_lock:
            if not name:
                latest = checkpoint.latest_checkpoint(directory, job.shard, job.num_shards)
                if latest is None:
                    raise ParameterServerError(
                        f"no complete checkpoint of shard {job.shard} of {job.num_shards} in {directory}", "NOT_FOUND"
                    )
                name = latest.name
            saved = checkpoint.read_shard_checkpoint(directory, name, job.shard, job.num_shards)
            _check_same_variables(saved.specs, list(store.specs.values()), name)
            state = StoreState(saved.global_step, dict(saved.versions), dict(saved.tensors))
            store.load_state(state, reason=f"shard {job.shard} was restored from checkpoint {name}")
        return pb.RestoreResponse(checkpoint=name, global_step=saved.global_step)

    # ------------------------------------------------------------------ Stats
    @refusing
    async def Stats(self, request: pb.StatsRequest, context: Context) -> pb.StatsResponse:  # noqa: N802
        counters = self.counters
        rejected = counters.rejected + (self.auth.rejected if self.auth is not None else 0)
        if self.store is None or self.job is None:
            return pb.StatsResponse(
                bytes_in=counters.bytes_in,
                bytes_out=counters.bytes_out,
                pushes_rejected=rejected,
                calls=counters.calls_so_far(),
            )
        stats = self.store.stats()
        return pb.StatsResponse(
            job_id=self.job.job_id,
            shard=self.job.shard,
            global_step=stats.global_step,
            variables=[
                pb.VariableStats(
                    name=name, version=stats.versions[name], bytes=spec.nbytes, slot_bytes=self.store.slot_nbytes(name)
                )
                for name, spec in self.store.specs.items()
            ],
            bytes_in=counters.bytes_in,
            bytes_out=counters.bytes_out,
            pushes_applied=stats.pushes_applied,
            pushes_stale=stats.pushes_stale,
            pushes_rejected=rejected + stats.pushes_rejected,
            updates=stats.updates,
            replicas=[
                pb.ReplicaStatsProto(
                    replica_id=r.replica_id,
                    last_step=r.last_step,
                    pushes=r.pushes,
                    last_seen_unix=r.last_seen,
                    steps_per_second=r.steps_per_second,
                )
                for r in stats.replicas.values()
            ],
            training=training_to_proto(self.store.training),
            calls=counters.calls_so_far(),
            latest_checkpoint=self._latest[0],
            latest_checkpoint_step=max(self._latest[1], 0),
            checkpoint_error=self._writer.error if self._writer is not None else "",
            steps_skipped=stats.steps_skipped,
            last_skipped=stats.last_skipped,
            checkpoints_written=self._written,
        )

    # ------------------------------------------------------------------ Reconfigure
    @refusing
    async def Reconfigure(self, request: pb.ReconfigureRequest, context: Context) -> pb.ReconfigureResponse:  # noqa: N802
        job, store = self._job_store()
        step = store.reconfigure(request.replicas_to_aggregate)
        # A later Init of this job (the job re-initialising after another shard was restarted) sends the
        # training config as it is now.
        job.training.replicas_to_aggregate = request.replicas_to_aggregate
        self._checkpoint_if_due(store)
        return pb.ReconfigureResponse(global_step=step, training=training_to_proto(store.training))


def wait_limit(context: Context, max_wait_s: float) -> float:
    """How long a call may wait for a step: a little less than the caller's deadline, at most ``max_wait_s``.

    Giving up before the caller does means the caller gets this server's
    account of whom it waited for, not a bare timeout.
    """
    remaining = context.time_remaining()
    return max_wait_s if remaining is None else min(0.9 * remaining, max_wait_s)


def _check_same_variables(saved: Sequence[Any], held: Sequence[Any], name: str) -> None:
    """Refuse a checkpoint whose variables differ from the job's, naming the first difference."""
    saved_by_name = {s.name: s for s in saved}
    for spec in held:
        other = saved_by_name.pop(spec.name, None)
        if other is None:
            raise ParameterServerError(f"checkpoint {name} has no variable '{spec.name}'", "FAILED_PRECONDITION")
        if (other.dtype, other.shape) != (spec.dtype, spec.shape):
            raise ParameterServerError(
                f"checkpoint {name} has '{spec.name}' as {other.dtype.name} {other.shape}, "
                f"the job holds {spec.dtype.name} {spec.shape}",
                "FAILED_PRECONDITION",
            )
    if saved_by_name:
        raise ParameterServerError(
            f"checkpoint {name} has variables this job does not: {', '.join(sorted(saved_by_name))}",
            "FAILED_PRECONDITION",
        )
