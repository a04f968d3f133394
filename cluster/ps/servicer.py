"""The parameter service's RPCs over one shard's store.

The servicer's methods are named exactly as the RPCs of
``protos/parameter_service.proto``. Each one checks its request at the door
(names, dtypes, shapes, chunk offsets, sizes, the replica and the step) and
refuses a bad one with a status code and a message naming the variable and
what was wrong, before anything changes: a push is assembled completely into
its own buffers and only then handed to the store, which applies it or not as
a whole. ``server.py`` hosts it.

Two parts that are not the shard's traffic have modules of their own, each
a small class the servicer owns: Init's checks and the assembly of the store
(``shard_init.ShardInit``), and the shard's checkpoints, saved, restored and
written every ``checkpoint_every`` steps (``shard_checkpoints.ShardCheckpoints``).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np

from cellgraph.protos import parameter_service_pb2 as pb
from cellgraph.protos import parameter_service_pb2_grpc as pb_grpc
from cellgraph.protos import tensor_pb2

from ..errors import ParameterServerError
from .auth import AsyncTokenAuthInterceptor
from .autosave import WRITTEN_WAIT_S
from .chunks import MAX_CHUNK_BYTES, MAX_MESSAGE_BYTES, release_all, tensor_chunks
from .door import Context, Counters, client_stream, refusing, refusing_stream
from .frames import Framed, tensor_chunk_frames
from .gradient_intake import Taken, take_gradient
from .messages import optimizer_to_proto, training_to_proto
from .shard_checkpoints import ShardCheckpoints
from .shard_init import ShardInit, refuse_other_job
from .step_server import serve_steps
from .store import ParameterStore

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
# A replica's account of a non-finite gradient (StepRequest.nonfinite) is kept and shown up to this length.
MAX_REASON_CHARS = 1000
# The smallest chunk a Pull may ask for: at 1 byte a 256 KiB variable took the server 48 s and 21 times its bytes
# in messages (one caller could hold a core for hours with a large model); a server's own limit may be smaller.
MIN_PULL_CHUNK_BYTES = 256

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
        self.max_chunk_bytes = max_chunk_bytes
        self.max_wait_s = max_wait_s
        self.stream_idle_s = stream_idle_s
        self.held_idle_s = held_idle_s
        self.auth = auth
        self.counters = Counters()
        self.store: ParameterStore | None = None
        self.job: pb.JobConfig | None = None
        # Init's checks and assembly (shard_init.py), and the shard's checkpoints (shard_checkpoints.py).
        self.shard_init = ShardInit(
            self.counters, max_chunk_bytes=max_chunk_bytes, max_bytes=max_bytes, init_wait_s=init_wait_s
        )
        self.checkpoints = ShardCheckpoints(
            Path(checkpoint_dir) if checkpoint_dir is not None else None, keep_checkpoints
        )

    # ------------------------------------------------------------------ helpers
    def _job_store(self) -> tuple[pb.JobConfig, ParameterStore]:
        if self.store is None or self.job is None:
            raise ParameterServerError(
                "this parameter server holds no job yet: a client must call Init first", "FAILED_PRECONDITION"
            )
        return self.job, self.store

    # ------------------------------------------------------------------ Init
    @refusing
    async def Init(self, request_iterator: AsyncIterator[pb.InitMessage], context: Context) -> pb.InitResponse:  # noqa: N802
        messages = client_stream(request_iterator, "Init", self.stream_idle_s)
        first = await anext(messages, None)
        if first is None or first.message.WhichOneof("kind") != "config":
            raise ParameterServerError("an Init stream must start with the job's config", "INVALID_ARGUMENT")
        config = first.message.config
        async with self.shard_init.turn(config.job_id, context):
            if self.job is not None and self.store is not None:
                refuse_other_job(self.job, config)
                return pb.InitResponse(global_step=self.store.global_step, already_initialized=True)
            if config.training.checkpoint_every > 0:
                self.checkpoints.need_directory()  # a job that checkpoints by itself needs somewhere to write
            store = await self.shard_init.build_store(config, messages)
            self.checkpoints.start(config, store)
            self.store, self.job = store, config
            return pb.InitResponse(global_step=store.global_step)

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
    async def Pull(self, request: pb.PullRequest, context: Context) -> AsyncGenerator[bytes, None]:  # noqa: N802
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
        if request.max_chunk_bytes < 0:  # was taken as 0, the default: a client's bug went unseen
            raise ParameterServerError(
                f"max_chunk_bytes must be 0 (the server's default) or more, got {request.max_chunk_bytes:,}",
                "INVALID_ARGUMENT",
            )
        names = list(request.names) or None
        if request.HasField("min_step"):
            await store.until_step(request.min_step, wait_s)
        step, values = store.read(names)
        limit = self.max_chunk_bytes
        if request.max_chunk_bytes > 0:
            limit = min(limit, max(request.max_chunk_bytes, MIN_PULL_CHUNK_BYTES))
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

        assemblers: dict[str, Taken] = {}
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
        assemblers: dict[str, Taken],
    ) -> None:
        """Take one chunk of a push at this server's chunk limit, and count its bytes (gradient_intake.py)."""
        self.counters.add(bytes_in=take_gradient(store, header, chunk, content, assemblers, self.max_chunk_bytes))

    async def before_push(self, store: ParameterStore, wait_s: float) -> None:
        """Wait until the checkpoint of the current global step, if one is being written, is on disk: a push
        must not move the step past it first (autosave.py). At most ``wait_s`` (within the caller's deadline):
        then the push goes on, and the writer's error says the checkpoint was late."""
        writer = self.checkpoints.writer
        if writer is not None:
            await writer.before_push(store.global_step, min(wait_s, WRITTEN_WAIT_S))

    def push(
        self,
        store: ParameterStore,
        header: pb.PushHeader,
        assemblers: dict[str, Taken],
        nonfinite: str = "",
    ) -> pb.PushResponse:
        """Hand a whole push, every gradient assembled, to the store; ``nonfinite``: what the replica found wrong
        with a gradient of this step on any shard (a Step's last message says it; cut to a readable length)."""
        grads = {name: a.gradient() for name, a in assemblers.items()}  # a big one as its chunks lie
        finite = {name for name, a in assemblers.items() if a.finite}
        fused = dict(a.fused_with for a in assemblers.values() if a.fused_with is not None)
        outcome = store.push(header.replica_id, header.step, grads, finite, nonfinite[:MAX_REASON_CHARS], fused)
        self.checkpoints.offer_due(store)
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
        assemblers: dict[str, Taken] = {}
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
    async def Step(self, request_iterator: AsyncIterator[Any], context: Context) -> AsyncGenerator[bytes, None]:  # noqa: N802
        # A replica's held stream: step after step of pushes and pulls (step_server.py).
        _, store = self._job_store()
        async for frame in serve_steps(self, store, request_iterator):
            yield frame

    # ------------------------------------------------------------------ Save / Restore
    @refusing
    async def Save(self, request: pb.SaveRequest, context: Context) -> pb.SaveResponse:  # noqa: N802
        job, store = self._job_store()
        return await self.checkpoints.save(job, store)

    @refusing
    async def Restore(self, request: pb.RestoreRequest, context: Context) -> pb.RestoreResponse:  # noqa: N802
        job, store = self._job_store()
        return await self.checkpoints.restore(job, store, request.checkpoint)

    def stopping(self, address: str) -> None:
        """End every call awaiting a step with UNAVAILABLE: the server at ``address`` is stopping."""
        if self.store is not None:
            self.store.abort_waiters(
                f"parameter server {address} is stopping; this call's step will not be reached here", "UNAVAILABLE"
            )

    def close(self) -> None:
        """Let a background checkpoint in progress finish (the server is stopping)."""
        self.checkpoints.close()

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
            latest_checkpoint=self.checkpoints.latest[0],
            latest_checkpoint_step=max(self.checkpoints.latest[1], 0),
            checkpoint_error=self.checkpoints.error,
            steps_skipped=stats.steps_skipped,
            last_skipped=stats.last_skipped,
            checkpoints_written=self.checkpoints.written,
        )

    # ------------------------------------------------------------------ Reconfigure
    @refusing
    async def Reconfigure(self, request: pb.ReconfigureRequest, context: Context) -> pb.ReconfigureResponse:  # noqa: N802
        job, store = self._job_store()
        step = store.reconfigure(request.replicas_to_aggregate)
        # A later Init of this job (the job re-initialising after another shard was restarted) sends the
        # training config as it is now.
        job.training.replicas_to_aggregate = request.replicas_to_aggregate
        self.checkpoints.offer_due(store)
        return pb.ReconfigureResponse(global_step=step, training=training_to_proto(store.training))


def wait_limit(context: Context, max_wait_s: float) -> float:
    """How long a call may wait for a step: a little less than the caller's deadline, at most ``max_wait_s``.

    Giving up before the caller does means the caller gets this server's
    account of whom it waited for, not a bare timeout.
    """
    remaining = context.time_remaining()
    return max_wait_s if remaining is None else min(0.9 * remaining, max_wait_s)
