"""``ShardCalls``: the connections to a job's parameter-server shards, and one call's life on them.

Each process opens its own channels (lazily, and again after a fork: ``!ls``
in a notebook forks the kernel) and each shard's pool of held Step streams.
A call against one shard retries while the server is UNAVAILABLE, backing
off exponentially, within one deadline, and its error names the shard and
what was asked of it. A call against several runs on one thread per shard,
and the first shard that fails ends it with its error at once (the others
are cancelled: a live shard may wait for a step the dead one never sends).
``ParameterClient`` (client.py) is a ``ShardCalls`` that knows the job's
layout; the checkpoint and stats calls, which need none, live here.

Examples
--------
>>> from cellgraph.cluster.ps import create_server
>>> server, port = create_server("127.0.0.1:0", token="t")
>>> with ShardCalls([f"127.0.0.1:{port}"], token="t", retries=1, timeout=5.0) as calls:
...     calls.save()
Traceback (most recent call last):
...
cellgraph.cluster.errors.ParameterServerError: parameter server 127.0.0.1:... (shard 0) refused Save: this parameter server holds no job yet: a client must call Init first
>>> server.stop(None).wait()
True
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent import futures
from typing import Self, TypeVar

import grpc

from cellgraph.protos import parameter_service_pb2 as pb
from cellgraph.protos import parameter_service_pb2_grpc as pb_grpc

from ..errors import STATUS_CODES, ParameterServerError
from .auth import ClientTLS, token_metadata
from .channels import ServiceStub, open_aio_channel, open_channel
from .chunks import MAX_CHUNK_BYTES
from .fanout import CANCEL_WAIT_S, FAN_OUT, Cancelled, FanOut, current_fan_out
from .held import StreamPool
from .malloc import tune_malloc
from .server import SERVICE_NAME

T = TypeVar("T")


class ShardCalls:
    """Calls to the shards of one job (shard ``i`` at ``addresses[i]``); see ``ParameterClient`` for the
    parameters."""

    def __init__(
        self,
        addresses: Sequence[str],
        token: str | None,
        *,
        tls: ClientTLS | None = None,
        timeout: float = 30.0,
        retries: int = 5,
        backoff: float = 0.05,
        max_chunk_bytes: int = MAX_CHUNK_BYTES,
    ) -> None:
        if not addresses:
            raise ParameterServerError("a ParameterClient needs the address of at least one server", "INVALID_ARGUMENT")
        tune_malloc()  # this process moves tensors in 4 MiB messages: keep their buffers (malloc.py)
        self.addresses = list(addresses)
        self.tls = tls
        self.timeout = timeout
        self.retries = max(1, retries)
        self.backoff = backoff
        self.max_chunk_bytes = max_chunk_bytes
        self._metadata = token_metadata(token) if token is not None else ()
        self._lock = threading.Lock()
        self._pid = -1
        self._channels: list[grpc.Channel] = []
        self._stubs: list[pb_grpc.ParameterServiceStub] = []
        self._pools: list[StreamPool] = []  # each shard's held Step streams
        self._pool: futures.ThreadPoolExecutor | None = None

    def _stub(self, shard: int) -> pb_grpc.ParameterServiceStub:
        with self._lock:
            if self._pid != os.getpid():
                # A forked child must not use its parent's channels: open its own (the parent's stay the parent's).
                self._pid, self._pool = os.getpid(), None
                self._channels = [open_channel(a, self.tls) for a in self.addresses]
                self._stubs = [ServiceStub(c) for c in self._channels]
                self._pools = [
                    StreamPool(functools.partial(open_aio_channel, a, self.tls), SERVICE_NAME) for a in self.addresses
                ]
            return self._stubs[shard]

    def _call(
        self,
        shard: int,
        what: str,
        call: Callable[[pb_grpc.ParameterServiceStub, float], T],
        retry: bool = True,
        timeout: float | None = None,
    ) -> T:
        """Run ``call(stub, seconds_left)`` against ``shard``, retrying while it is UNAVAILABLE, within ``timeout``."""
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        delay, attempt = self.backoff, 0
        while True:
            attempt += 1
            try:
                return call(self._stub(shard), max(0.001, deadline - time.monotonic()))
            except grpc.RpcError as err:
                code = err.code()  # type: ignore[attr-defined]
                retry_now = retry and code == grpc.StatusCode.UNAVAILABLE and attempt < self.retries
                if retry_now and time.monotonic() + delay < deadline:
                    scope = current_fan_out()
                    if scope is not None and scope.failed.wait(delay):
                        raise Cancelled() from None  # another shard failed meanwhile: its error is the news
                    if scope is None:
                        time.sleep(delay)
                    delay = min(2 * delay, 2.0)
                    continue
                raise self._error(shard, what, err, attempt, timeout) from None

    def _error(self, shard: int, what: str, err: grpc.RpcError, attempts: int, timeout: float) -> ParameterServerError:
        code = err.code().name  # type: ignore[attr-defined]
        details = err.details() or code  # type: ignore[attr-defined]
        where = f"parameter server {self.addresses[shard]} (shard {shard})"
        if code == "UNAVAILABLE":
            return ParameterServerError(
                f"{where} did not answer {what} after {attempts} attempt(s) within {timeout:g} s: {details}. "
                "Is it running, and is the address right?",
                code,
            )
        if code == "DEADLINE_EXCEEDED" and details.lower() in ("deadline exceeded", code.lower()):
            # gRPC's own words say less, and the server refused nothing: it did not answer in time.
            return ParameterServerError(f"{where} gave no answer to {what} within the {timeout:g} s deadline", code)
        return ParameterServerError(f"{where} refused {what}: {details}", code if code in STATUS_CODES else "UNKNOWN")

    def _each_shard(self, shards: Sequence[int], work: Callable[[int], T]) -> dict[int, T]:
        """``work(shard)`` for every shard, in parallel; the first shard to fail ends it with its error at once.

        The other shards' calls are cancelled then: a live shard may be waiting
        for a step that the failed one will never let happen, and the caller
        (a replica that rejoins the job) needs the failure now, not at the
        live shard's deadline.
        """
        if len(shards) == 1:
            return {shards[0]: work(shards[0])}
        self._stub(0)  # (re)open channels and forget a parent's pool before fanning out
        with self._lock:
            if self._pool is None:
                self._pool = futures.ThreadPoolExecutor(len(self.addresses), thread_name_prefix="cellgraph-psclient")
            pool = self._pool
        scope = FanOut()

        def run(shard: int) -> T:
            FAN_OUT.scope = scope
            try:
                return work(shard)
            except BaseException as err:
                scope.fail(err)
                raise
            finally:
                FAN_OUT.scope = None

        running = {shard: pool.submit(run, shard) for shard in shards}
        futures.wait(running.values(), return_when=futures.FIRST_EXCEPTION)
        if scope.error is not None:
            # Let the cancelled calls unwind (it takes milliseconds) so that the pool is free for the next call.
            futures.wait(running.values(), timeout=CANCEL_WAIT_S)
            raise scope.error
        return {shard: f.result() for shard, f in running.items()}

    def _every_shard(self, what: str, call: Callable[[pb_grpc.ParameterServiceStub, float], T]) -> dict[int, T]:
        """``call`` against every shard in parallel (``_each_shard``), each with retries (``_call``)."""
        return self._each_shard(range(len(self.addresses)), lambda shard: self._call(shard, what, call))

    # ------------------------------------------------------------------ checkpoints and stats
    def save(self) -> str:
        """Checkpoint every shard; return the checkpoint's name (the same on every shard only if their steps agree)."""
        answers = self._every_shard(
            "Save", lambda stub, left: stub.Save(pb.SaveRequest(), timeout=left, metadata=self._metadata)
        )
        names = sorted({a.checkpoint for a in answers.values()})
        return names[0] if len(names) == 1 else ",".join(names)

    def restore(self, checkpoint: str = "") -> int:
        """Restore every shard from ``checkpoint`` (the latest complete one when empty); return the global step."""
        request = pb.RestoreRequest(checkpoint=checkpoint)
        call = lambda stub, left: stub.Restore(request, timeout=left, metadata=self._metadata)
        answers = self._every_shard(f"Restore of {checkpoint or 'the latest checkpoint'}", call)
        return min(a.global_step for a in answers.values())

    def reconfigure(self, replicas_to_aggregate: int) -> int:
        """Sync mode: make a step of ``replicas_to_aggregate`` gradients on every shard; return the global step."""
        request = pb.ReconfigureRequest(replicas_to_aggregate=replicas_to_aggregate)
        call = lambda stub, left: stub.Reconfigure(request, timeout=left, metadata=self._metadata)
        answers = self._every_shard(f"Reconfigure to {replicas_to_aggregate} replica(s) per step", call)
        return min(a.global_step for a in answers.values())

    def stats(self) -> list[pb.StatsResponse]:
        """Every shard's ``Stats``, in shard order."""
        answers = self._every_shard(
            "Stats", lambda stub, left: stub.Stats(pb.StatsRequest(), timeout=left, metadata=self._metadata)
        )
        return [answers[s] for s in range(len(self.addresses))]

    def close(self) -> None:
        """Close this process's channels and threads; the client reopens them if used again."""
        with self._lock:
            if self._pid == os.getpid():
                for pool in self._pools:
                    pool.close()
                for channel in self._channels:
                    channel.close()
                if self._pool is not None:
                    self._pool.shutdown(wait=False)
            self._pid, self._channels, self._stubs, self._pools, self._pool = -1, [], [], [], None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
