"""The parameter server: a gRPC service in front of one shard's store.

The servicer's methods are named exactly as the RPCs of
``protos/parameter_service.proto``. Each one checks its request at the door
(names, dtypes, shapes, chunk offsets, sizes, the replica and the step) and
refuses a bad one with a status code and a message naming the variable and
what was wrong, before anything changes: a push is assembled completely into
its own buffers and only then handed to the store, which applies it or not as
a whole.

``create_server(address, token=...)`` returns ``(server, port)`` so tests bind
port 0. Authentication is on unless ``token=None`` is passed on purpose; TLS
is the ``tls=`` argument; the standard health service answers without a token.

Examples
--------
>>> from cellgraph.cluster.ps import ParameterClient, create_server, new_token
>>> import numpy as np
>>> token = new_token()
>>> server, port = create_server("127.0.0.1:0", token=token)
>>> client = ParameterClient([f"127.0.0.1:{port}"], token=token)
>>> client.init("demo", {"w": np.zeros(3, np.float32)})
0
>>> client.close(); server.stop(None).wait()
True
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeAlias, TypeVar

import grpc
import numpy as np
from google.protobuf.message import DecodeError, Message
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from cellgraph.protos import parameter_service_pb2 as pb
from cellgraph.protos import parameter_service_pb2_grpc as pb_grpc
from cellgraph.protos import tensor_pb2

from ..errors import ParameterServerError
from . import checkpoint
from .auth import AsyncTokenAuthInterceptor, ServerTLS
from .autosave import CheckpointWriter
from .checkpoint import CheckpointInfo
from .chunks import MAX_CHUNK_BYTES, TensorAssembler, serialize, tensor_chunk_frames, tensor_chunks
from .config import SLOTS, listed, quoted
from .messages import (
    optimizer_from_proto,
    optimizer_to_proto,
    spec_from_proto,
    training_from_proto,
    training_to_proto,
)
from .store import ParameterStore, StoreState

SERVICE_NAME = "cellgraph.ParameterService"
# Room above the largest chunk for the fields around it.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
# A pull that waits for a step and carries no deadline of its own waits at most this long.
DEFAULT_MAX_WAIT_S = 300.0
# How many bytes of variables one server agrees to hold; more is RESOURCE_EXHAUSTED.
DEFAULT_MAX_BYTES = 64 * 1024**3
# How long an Init waits for another one in progress (one stalled client must not block the next forever).
DEFAULT_INIT_WAIT_S = 60.0
# A client stream (Init, Push) that sends nothing for this long is ended: a stalled client holds no buffer forever.
DEFAULT_STREAM_IDLE_S = 60.0
# How long stop() lets the calls in flight finish when asked for no grace, and how long it waits for the loop.
STOP_WAIT_S = 30.0
# How often an Init waiting for another one looks again whether it has finished.
INIT_POLL_S = 0.01
# The longest job id and checkpoint name taken: both are repeated in messages.
MAX_ID_CHARS = 200

R = TypeVar("R")
_PULL_CHUNK_FIELD = pb.PullMessage.DESCRIPTOR.fields_by_name["chunk"].number


def _method_handlers(servicer: ParameterServicer) -> dict[str, grpc.RpcMethodHandler]:
    """The handlers the generated ``add_ParameterServiceServicer_to_server`` would register, except that a
    response may be a frame serialized by hand (``tensor_chunk_frames``)."""
    kinds = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }
    handlers = {}
    for method in pb.DESCRIPTOR.services_by_name["ParameterService"].methods:
        kind = kinds[method.client_streaming, method.server_streaming]
        request = getattr(pb, method.input_type.name)
        handlers[method.name] = kind(getattr(servicer, method.name), _lenient(request), serialize)
    return handlers


class _Undecodable:
    """A request whose bytes are no message of its type: the handler refuses it with INVALID_ARGUMENT.

    gRPC answers a deserializer's exception with INTERNAL ("Exception deserializing
    request!"), which says the server is at fault; here the request is.
    """

    def __init__(self, message: type[Message], data: bytes, error: DecodeError) -> None:
        self.problem = (
            f"a request of {len(data):,} bytes is not a valid {message.DESCRIPTOR.full_name} message: {error}"
        )


def _lenient(message: type[Message]) -> Callable[[bytes], Message | _Undecodable]:
    def parse(data: bytes) -> Message | _Undecodable:
        try:
            return message.FromString(data)
        except DecodeError as err:
            return _Undecodable(message, data, err)

    return parse


def _decoded(request: Any) -> Any:
    """``request`` checked for ``_Undecodable``; a stream's messages are checked as they are read (``_messages``)."""
    if isinstance(request, _Undecodable):
        raise ParameterServerError(request.problem, "INVALID_ARGUMENT")
    return request


async def _messages(requests: AsyncIterator[Any], what: str, idle_s: float) -> AsyncIterator[Any]:
    """The decoded messages of a client stream; one that sends nothing for ``idle_s`` seconds is ended."""
    iterator = aiter(requests)
    while True:
        try:
            async with asyncio.timeout(idle_s):
                message = await anext(iterator)
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise ParameterServerError(
                f"the {what} stream sent nothing for {idle_s:g} s (this server's idle limit per stream); "
                "it was ended and what it had sent was dropped",
                "DEADLINE_EXCEEDED",
            ) from None
        yield _decoded(message)


def available_memory() -> int | None:
    """Bytes this process could still allocate: MemAvailable, less where a cgroup limit is tighter; None if unknown."""
    found = []
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
    with contextlib.suppress(OSError, ValueError):
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            found.append(int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text()))
    if not found and hasattr(os, "sysconf"):
        with contextlib.suppress(OSError, ValueError):
            found.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    return max(0, min(found)) if found else None


class _Counters:
    """Bytes in and out and refused requests, shared by the handler threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.bytes_in = self.bytes_out = self.rejected = 0
        self.calls: dict[str, int] = {}

    def add(self, *, bytes_in: int = 0, bytes_out: int = 0, rejected: int = 0, call: str | None = None) -> None:
        with self._lock:
            self.bytes_in += bytes_in
            self.bytes_out += bytes_out
            self.rejected += rejected
            if call is not None:
                self.calls[call] = self.calls.get(call, 0) + 1

    def calls_so_far(self) -> dict[str, int]:
        with self._lock:
            return dict(self.calls)


Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"


async def _abort(self: ParameterServicer, err: ParameterServerError, context: Context) -> None:
    if err.code != "DEADLINE_EXCEEDED":
        self.counters.add(rejected=1)
    await context.abort(grpc.StatusCode[err.code], str(err))


def _refusing(method: Callable[..., Awaitable[R]]) -> Callable[..., Awaitable[R]]:
    """Turn a ParameterServerError raised by a handler into the RPC's status, and count it."""

    @functools.wraps(method)
    async def handler(self: ParameterServicer, request: Any, context: Context) -> R:
        self.counters.add(call=method.__name__)
        try:
            return await method(self, _decoded(request), context)
        except ParameterServerError as err:
            await _abort(self, err, context)
            raise AssertionError("context.abort returns only by raising") from err

    return handler


def _refusing_stream(method: Callable[..., AsyncIterator[R]]) -> Callable[..., AsyncIterator[R]]:
    """``_refusing`` for a handler that streams its response."""

    @functools.wraps(method)
    async def handler(self: ParameterServicer, request: Any, context: Context) -> AsyncIterator[R]:
        self.counters.add(call=method.__name__)
        try:
            async for response in method(self, _decoded(request), context):
                yield response
        except ParameterServerError as err:
            await _abort(self, err, context)

    return handler


def _check_chunk_size(size: int, limit: int, what: str) -> None:
    if size > limit:
        raise ParameterServerError(
            f"a chunk of {what} carries {size:,} bytes, over this server's limit of {limit:,} per chunk",
            "RESOURCE_EXHAUSTED",
        )


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
        auth: AsyncTokenAuthInterceptor | None = None,
    ) -> None:
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None
        self.keep_checkpoints = keep_checkpoints
        self.max_chunk_bytes = max_chunk_bytes
        self.max_bytes = max_bytes
        self.max_wait_s = max_wait_s
        self.init_wait_s = init_wait_s
        self.stream_idle_s = stream_idle_s
        self.auth = auth
        self.counters = _Counters()
        self.store: ParameterStore | None = None
        self.job: pb.JobConfig | None = None
        # One Init at a time, waited for at most init_wait_s. A thread lock taken without blocking (_init_turn
        # polls it), so that waiting for it holds no thread and a cancelled wait can never leave it taken.
        self._init_lock = threading.Lock()
        self._init_holder: tuple[str, float] = ("", 0.0)  # the Init holding the lock: job id, monotonic start
        self._save_lock = threading.Lock()  # one Save or Restore at a time
        self._writer: CheckpointWriter | None = None  # the job's own checkpoints (checkpoint_every)
        self._latest: tuple[str, int] = ("", -1)  # the newest checkpoint written: name, global step

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
    @_refusing
    async def Init(self, request_iterator: AsyncIterator[pb.InitMessage], context: Context) -> pb.InitResponse:  # noqa: N802
        messages = _messages(request_iterator, "Init", self.stream_idle_s)
        first = await anext(messages, None)
        if first is None or first.WhichOneof("kind") != "config":
            raise ParameterServerError("an Init stream must start with the job's config", "INVALID_ARGUMENT")
        config = first.config
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

    async def _build_store(self, config: pb.JobConfig, messages: AsyncIterator[pb.InitMessage]) -> ParameterStore:
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
        by_name = {s.name: s for s in specs}
        if len(by_name) != len(specs):
            raise ParameterServerError("the job config names a variable twice", "INVALID_ARGUMENT")
        self._check_memory(job, config.shard, total, optimizer.kind, training.mode)
        # An assembler (and its array) is made when its variable's first chunk arrives, not on the declaration.
        assemblers: dict[str, TensorAssembler] = {}
        try:
            async for message in messages:
                if message.WhichOneof("kind") != "chunk":
                    raise ParameterServerError(
                        "an Init stream carries one config, then only chunks", "INVALID_ARGUMENT"
                    )
                self._receive_initial(message.chunk, by_name, assemblers)
            for spec in specs:  # a variable no chunk arrived for: finish() names its missing bytes
                assemblers.setdefault(spec.name, TensorAssembler(spec, f"initial value of {quoted(spec.name)}"))
            initial = {s.name: assemblers[s.name].finish() for s in specs}
            return ParameterStore(config.job_id, specs, initial, optimizer, training)
        finally:
            # Refused, cancelled or done: the buffers go now, not when the cycle collector reaches this frame
            # (a cancelled call's traceback keeps it alive). The store holds copies of its own.
            _release(assemblers)

    def _receive_initial(
        self, chunk: tensor_pb2.TensorChunk, by_name: dict[str, Any], assemblers: dict[str, TensorAssembler]
    ) -> None:
        spec = by_name.get(chunk.name)
        if spec is None:
            raise ParameterServerError(
                f"initial value for {quoted(chunk.name)}, which is not a variable of this shard; "
                f"it holds: {listed(by_name, quote=False)}",
                "NOT_FOUND",
            )
        what = f"initial value of {quoted(chunk.name)}"
        _check_chunk_size(len(chunk.content), self.max_chunk_bytes, what)
        assembler = assemblers.get(spec.name)
        if assembler is None:
            assembler = assemblers[spec.name] = TensorAssembler(spec, what)
        assembler.add(chunk)
        self.counters.add(bytes_in=len(chunk.content))

    def _check_memory(self, job: str, shard: int, variables: int, optimizer: str, mode: str) -> None:
        """Refuse a job whose shard would not fit in this machine's free memory, before allocating any of it."""
        available = available_memory()
        if available is None:
            return
        slots = [slot for slot in SLOTS[optimizer] if slot != "t"]  # "t" is a scalar
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
    @_refusing
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
    @_refusing_stream
    async def Pull(self, request: pb.PullRequest, context: Context) -> AsyncIterator[bytes]:  # noqa: N802
        # Each response is a PullMessage serialized by hand (tensor_chunk_frames): one copy of the content.
        _, store = self._job_store()
        step, values, limit = await self._snapshot(store, request, context)
        for name, (version, value) in values.items():
            head = pb.PullMessage(global_step=step, version=version).SerializeToString()
            for frame in tensor_chunk_frames(name, value, limit, field=_PULL_CHUNK_FIELD, head=head):
                yield frame
            self.counters.add(bytes_out=value.nbytes)

    async def _snapshot(
        self, store: ParameterStore, request: pb.PullRequest, context: Context
    ) -> tuple[int, dict[str, tuple[int, np.ndarray]], int]:
        """The requested variables once ``min_step`` is reached: (global step, values, chunk size)."""
        names = list(request.names) or None
        if request.HasField("min_step"):
            remaining = context.time_remaining()
            # Give up a little before the caller's deadline, so that the caller
            # gets this server's account of whom it waited for, not a bare timeout.
            timeout = self.max_wait_s if remaining is None else min(0.9 * remaining, self.max_wait_s)
            await store.until_step(request.min_step, timeout)
        step, values = store.read(names)
        limit = self.max_chunk_bytes
        if request.max_chunk_bytes > 0:
            limit = min(limit, request.max_chunk_bytes)
        return step, values, limit

    # ------------------------------------------------------------------ Push
    @_refusing
    async def Push(self, request_iterator: AsyncIterator[pb.PushMessage], context: Context) -> pb.PushResponse:  # noqa: N802
        _, store = self._job_store()
        messages = _messages(request_iterator, "Push", self.stream_idle_s)
        first = await anext(messages, None)
        if first is None or first.WhichOneof("kind") != "header":
            raise ParameterServerError("a Push stream must start with a header (replica_id, step)", "INVALID_ARGUMENT")
        header = first.header

        assemblers: dict[str, TensorAssembler] = {}
        try:
            async for message in messages:
                if message.WhichOneof("kind") != "chunk":
                    raise ParameterServerError(
                        f"replica {header.replica_id}'s push for step {header.step} has a second header; "
                        "a Push stream carries one header, then only chunks",
                        "INVALID_ARGUMENT",
                    )
                self._receive_gradient(store, header, message.chunk, assemblers)
            return self._push(store, header, assemblers)
        finally:
            _release(assemblers)

    def _receive_gradient(
        self,
        store: ParameterStore,
        header: pb.PushHeader,
        chunk: tensor_pb2.TensorChunk,
        assemblers: dict[str, TensorAssembler],
    ) -> None:
        """Write one chunk of a push into its gradient's own buffer (made at the gradient's first chunk)."""
        assembler = assemblers.get(chunk.name)
        if assembler is None:
            spec = store.specs.get(chunk.name)
            if spec is None:
                raise ParameterServerError(
                    f"gradient for unknown variable {quoted(chunk.name)} in replica {header.replica_id}'s push "
                    f"for step {header.step}; this shard holds: {listed(store.specs, quote=False)}",
                    "NOT_FOUND",
                )
            assembler = assemblers[chunk.name] = TensorAssembler(spec, f"gradient for {quoted(chunk.name)}")
        _check_chunk_size(len(chunk.content), self.max_chunk_bytes, f"gradient for {quoted(chunk.name)}")
        assembler.add(chunk)
        self.counters.add(bytes_in=len(chunk.content))

    def _push(
        self, store: ParameterStore, header: pb.PushHeader, assemblers: dict[str, TensorAssembler]
    ) -> pb.PushResponse:
        """Hand a whole push, every gradient assembled, to the store."""
        grads = {name: a.finish() for name, a in assemblers.items()}
        outcome = store.push(header.replica_id, header.step, grads)
        self._checkpoint_if_due(store)
        return pb.PushResponse(
            status=pb.PushResponse.Status.Value(outcome.status.upper()),
            global_step=outcome.global_step,
            staleness=outcome.staleness,
        )

    # ------------------------------------------------------------------ PushPull
    @_refusing
    async def PushPull(self, request: pb.PushPullRequest, context: Context) -> pb.PushPullResponse:  # noqa: N802
        _, store = self._job_store()
        if not request.HasField("header"):
            raise ParameterServerError("a PushPull request needs a header (replica_id, step)", "INVALID_ARGUMENT")
        response = pb.PushPullResponse()
        assemblers: dict[str, TensorAssembler] = {}
        try:
            for chunk in request.chunks:
                self._receive_gradient(store, request.header, chunk, assemblers)
            response.push.CopyFrom(self._push(store, request.header, assemblers))
        finally:
            _release(assemblers)
        step, values, limit = await self._snapshot(store, request.pull, context)
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

    # ------------------------------------------------------------------ Save / Restore
    @_refusing
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

    @_refusing
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
    @_refusing
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
                pb.VariableStats(name=name, version=stats.versions[name], bytes=spec.nbytes)
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
        )

    # ------------------------------------------------------------------ Reconfigure
    @_refusing
    async def Reconfigure(self, request: pb.ReconfigureRequest, context: Context) -> pb.ReconfigureResponse:  # noqa: N802
        job, store = self._job_store()
        step = store.reconfigure(request.replicas_to_aggregate)
        # A later Init of this job (the job re-initialising after another shard was restarted) sends the
        # training config as it is now.
        job.training.replicas_to_aggregate = request.replicas_to_aggregate
        self._checkpoint_if_due(store)
        return pb.ReconfigureResponse(global_step=step, training=training_to_proto(store.training))


def _release(assemblers: dict[str, TensorAssembler]) -> None:
    for assembler in assemblers.values():
        assembler.release()
    assemblers.clear()


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


class ParameterServer:
    """A running parameter server: a ``grpc.aio`` server on an event loop of its own thread.

    Its face is synchronous, like ``grpc.Server``'s, for the plugin, the CLI and
    the tests: ``stop(grace)`` returns an event set once it has stopped, and
    ``wait_for_termination(timeout)`` blocks. ``servicer`` is the shard's servicer.
    """

    def __init__(
        self, server: grpc.aio.Server, servicer: ParameterServicer, loop: asyncio.AbstractEventLoop, address: str
    ) -> None:
        self._server = server
        self.servicer = servicer
        self._loop = loop
        self._address = address
        self._stopped = threading.Event()
        self._stopping = False
        self._lock = threading.Lock()

    def stop(self, grace: float | None) -> threading.Event:
        """Wake every waiting call (UNAVAILABLE), let the others finish within ``grace`` seconds, then stop."""
        with self._lock:
            if not self._stopping:
                self._stopping = True
                if self._loop.is_closed():
                    self._stopped.set()
                else:
                    asyncio.run_coroutine_threadsafe(self._stop(grace), self._loop)
        return self._stopped

    async def _stop(self, grace: float | None) -> None:
        try:
            self.servicer.stopping(self._address)
            await self._server.stop(grace)
        finally:
            self._stopped.set()
            self._loop.call_soon(self._loop.stop)

    def wait_for_termination(self, timeout: float | None = None) -> bool:
        """Block until the server has stopped, at most ``timeout`` seconds; whether it has."""
        return self._stopped.wait(timeout)


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        loop.close()


def create_server(
    address: str = "127.0.0.1:0",
    *,
    token: str | None,
    tls: ServerTLS | None = None,
    checkpoint_dir: str | Path | None = None,
    keep_checkpoints: int = 5,
    max_chunk_bytes: int = MAX_CHUNK_BYTES,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_wait_s: float = DEFAULT_MAX_WAIT_S,
    init_wait_s: float = DEFAULT_INIT_WAIT_S,
    stream_idle_s: float = DEFAULT_STREAM_IDLE_S,
) -> tuple[ParameterServer, int]:
    """Start a parameter server on ``address``; return the running server and its port.

    The server is asynchronous (``grpc.aio``) on an event loop of its own
    thread: a call waiting for a step holds a future, not a thread, so any
    number of replicas may wait on one shard, and health checks answer whatever
    the calls in progress.

    Parameters
    ----------
    address
        ``host:port``; port 0 picks a free port. Bind to 127.0.0.1 (the
        default) unless other machines must reach it.
    token
        The job's token: every call but the health check must carry it.
        ``None`` turns authentication off, and must be asked for explicitly.
    tls
        Certificates for TLS (and, with ``client_ca``, for checking clients'
        certificates). Plain TCP when ``None``.
    checkpoint_dir
        Where ``Save`` writes and ``Restore`` reads; ``keep_checkpoints`` are kept.
    max_bytes, init_wait_s
        The most bytes of variables one Init may declare (and never more than
        this machine's available memory); how long an Init waits for another
        one in progress before DEADLINE_EXCEEDED.
    stream_idle_s
        How long an Init or Push stream may send nothing before it is ended
        (DEADLINE_EXCEEDED) and its buffers dropped.

    Examples
    --------
    >>> server, port = create_server("127.0.0.1:0", token="s3cret")
    >>> port > 0
    True
    >>> server.stop(None).wait()
    True
    """
    auth = AsyncTokenAuthInterceptor(token) if token is not None else None
    servicer = ParameterServicer(
        checkpoint_dir=checkpoint_dir,
        keep_checkpoints=keep_checkpoints,
        max_chunk_bytes=max_chunk_bytes,
        max_bytes=max_bytes,
        max_wait_s=max_wait_s,
        init_wait_s=init_wait_s,
        stream_idle_s=stream_idle_s,
        auth=auth,
    )
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=_run_loop, args=(loop,), name=f"cellgraph-ps-{address}", daemon=True)
    thread.start()
    try:
        server, port = asyncio.run_coroutine_threadsafe(_start(address, servicer, auth, tls), loop).result()
    except BaseException:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(STOP_WAIT_S)
        raise
    return ParameterServer(server, servicer, loop, f"{address.rsplit(':', 1)[0]}:{port}"), port


async def _start(
    address: str, servicer: ParameterServicer, auth: AsyncTokenAuthInterceptor | None, tls: ServerTLS | None
) -> tuple[grpc.aio.Server, int]:
    """Make, bind and start the aio server, on the loop that will run it."""
    options = [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        # Two servers must never share a port silently.
        ("grpc.so_reuseport", 0),
    ]
    server = grpc.aio.server(interceptors=[auth] if auth is not None else [], options=options)
    handlers = _method_handlers(servicer)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    health_servicer = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    try:
        port = (
            server.add_secure_port(address, tls.credentials()) if tls is not None else server.add_insecure_port(address)
        )
    except RuntimeError:  # grpcio >= 1.57 raises where older versions returned port 0
        port = 0
    if port == 0:
        await server.stop(None)
        raise ParameterServerError(
            f"could not bind the parameter server to {address}: is the port in use, or the address not this machine's?",
            "UNAVAILABLE",
        )
    await server.start()
    for service in ("", SERVICE_NAME):
        await health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    return server, port


def serve_forever(server: ParameterServer, stop: threading.Event, grace_s: float = 5.0) -> None:
    """Block until ``stop`` is set, then stop ``server``, letting calls in flight finish within ``grace_s``."""
    with contextlib.suppress(KeyboardInterrupt):
        while not stop.wait(0.5):
            pass
    server.stop(grace_s).wait(grace_s + 1.0)
    close_servicer(server)


def close_servicer(server: ParameterServer) -> None:
    """After ``server.stop``: let its background checkpoint in progress finish."""
    servicer = getattr(server, "servicer", None)
    if isinstance(servicer, ParameterServicer):
        servicer.close()
