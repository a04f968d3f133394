"""A step whose gradients leave while backprop goes on: communication hidden behind compute.

``ParameterClient.start_step`` returns a ``StreamedStep``. The replica hands
it each gradient the moment the executor has computed it (``push``); the step
packs gradients into messages of about ``FLUSH_BYTES`` and sends each on its
shard's held Step stream at once, from the step loop's thread, while the
replica's thread goes on computing. ``finish`` sends the last message of each
shard (the pull after the push) and waits for the answers.

In sync mode nothing changes for the server: a push is still taken whole,
when its last message arrives, and the pull still waits for the step's update.
What moves is when the bytes travel. ``StepResult.overlap`` is the share of
the step's communication (from the first byte sent to the last answer) that
ran while the replica was still computing.

Examples
--------
>>> import numpy as np
>>> from cellgraph.cluster.ps import ParameterClient, OptimizerConfig, create_server
>>> server, port = create_server("127.0.0.1:0", token="t")
>>> client = ParameterClient([f"127.0.0.1:{port}"], token="t")
>>> client.init("job", {"w": np.zeros(3, np.float32), "b": np.zeros(2, np.float32)}, OptimizerConfig("sgd", 1.0))
0
>>> _ = client.register(0)
>>> step = client.start_step(step=0, replica_id=0)
>>> step.push("b", np.ones(2, np.float32))  # as backprop produces it
>>> step.push("w", np.ones(3, np.float32))
>>> result = step.finish()
>>> result.pushed.status, result.pulled.values["w"]
('applied', array([-1., -1., -1.], dtype=float32))
>>> client.close(); server.stop(None).wait()
True
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np

from cellgraph.protos import parameter_service_pb2 as pb

from ..errors import ParameterServerError
from .config import VariableSpec
from .frames import Framed, chunk_parts, length_delimited
from .held import _CHUNKS, _HEADER, _MORE, HeldStream, PullPlan, ShardReceiver, StepTimeout, put_threadsafe, step_frames
from .results import PullResult, PushResult, push_result

if TYPE_CHECKING:
    from .client import ParameterClient

# Gradients are sent in messages of at least this many bytes (the last one of a shard may be smaller):
# big enough that a message's fixed cost is small beside its bytes, small enough to start early.
FLUSH_BYTES = 16 * 1024


@dataclass(frozen=True)
class StepResult:
    """A finished step: what the shards did with the push, what was pulled, and the overlap."""

    pushed: PushResult
    pulled: PullResult
    overlap: float  # share of communication time that ran while the replica still computed (0 to 1)
    communication_s: float  # from the first message sent to the last answer received


class _ShardSend:
    """One shard's part of a streamed step: its held stream, the frames not sent yet, its answer."""

    def __init__(self, stream: HeldStream, receiver: ShardReceiver | None) -> None:
        self.stream = stream
        self.receiver = receiver
        self.frames: asyncio.Queue[tuple[bytes, bool]] = asyncio.Queue()
        self.sent: list[float] = []
        self.parts: list[Any] = []
        self.size = 0
        self.pushing = False  # a gradient of this shard was added: its first message carries the push's header
        self.started = False
        self.answers: list[pb.PushResponse] = []
        self.future: concurrent.futures.Future[None] | None = None

    def on_answer(self, framed: Framed[pb.StepResponse]) -> None:  # on the step loop
        if framed.message.HasField("push"):
            self.answers.append(framed.message.push)
        if self.receiver is not None and framed.message.values:
            self.receiver.add(framed, framed.message.values)


class StreamedStep:
    """A push sent gradient by gradient as they are computed, and the pull after it (see the module)."""

    def __init__(
        self,
        client: ParameterClient,
        step: int,
        replica_id: int,
        min_step: int | None,
        names: Sequence[str] | None,
        out: Mapping[str, np.ndarray] | None,
        timeout: float,
    ) -> None:
        self.client = client
        self.step, self.replica_id = step, replica_id
        self.header = pb.PushHeader(replica_id=replica_id, step=step).SerializeToString()
        self.what = f"push and pull of replica {replica_id} for step {step}"
        self.plan: PullPlan = client._pull_plan(names, min_step, replica_id, out)
        self.timeout = timeout
        self.started = time.monotonic()
        self.grads: dict[str, np.ndarray] = {}
        self.shards: dict[int, _ShardSend] = {}

    def _shard(self, shard: int) -> _ShardSend:
        send = self.shards.get(shard)
        if send is None:
            self.client._stub(shard)  # channels of this process
            stream = self.client._pools[shard].take(self.client._metadata)
            receiver = self.plan.receiver(shard) if shard in self.plan.requests else None
            send = self.shards[shard] = _ShardSend(stream, receiver)
        return send

    def push(self, name: str, grad: np.ndarray) -> None:
        """Send ``name``'s gradient (once its shard has ``FLUSH_BYTES`` waiting); checked like ``push``'s."""
        pieces = self.client._push_pieces({name: grad})
        self.grads[name] = grad
        for shard, items in pieces.items():
            send = self._shard(shard)
            for spec, piece in items:
                self._add(send, spec, piece)
            if send.size >= FLUSH_BYTES:
                self._flush(send, last=None)

    def _add(self, send: _ShardSend, spec: VariableSpec, piece: np.ndarray) -> None:
        send.pushing = True
        for chunk in chunk_parts(spec.name, piece, self.client.max_chunk_bytes):
            field = length_delimited(_CHUNKS, chunk)
            send.parts += field
            send.size += sum(p.nbytes if isinstance(p, memoryview) else len(p) for p in field)

    def _flush(self, send: _ShardSend, last: bytes | None) -> None:
        """Send what ``send`` holds (and, with ``last``, the step's last message's own fields)."""
        head = length_delimited(_HEADER, [self.header]) if send.pushing and not send.started else []
        tail = [last] if last is not None else [_MORE]
        frame = b"".join([*head, *send.parts, *tail])
        send.parts, send.size = [], 0
        if not send.started:
            send.started = True
            send.future = send.stream.start_streamed(send.frames, send.on_answer, send.sent)
        put_threadsafe(send.frames, (frame, last is not None))

    def finish(self) -> StepResult:
        """Send every shard's last message (the pull) and wait for the answers, within the step's deadline."""
        computed = time.monotonic()
        missing = [name for name in self.client._need_layout() if name not in self.grads]
        if missing and self.grads:
            self.abort()
            raise ParameterServerError(
                f"{self.what}: no gradient was pushed for {', '.join(map(repr, missing))}", "INVALID_ARGUMENT"
            )
        deadline = self.started + self.timeout
        for shard in sorted(set(self.shards) | set(self.plan.requests)):
            send = self._shard(shard)
            request = self.plan.requests.get(shard)
            left = max(0.001, deadline - time.monotonic())
            # The last message's own fields: step_frames' tail (the pull, the server's wait) without a push.
            [tail] = step_frames([], None, request, 0.9 * left, self.client.max_chunk_bytes)
            self._flush(send, last=tail)
        pushed: dict[int, pb.PushResponse] = {}
        pulled: dict[int, tuple[int, dict[str, int]]] = {}
        sends = dict(self.shards)
        try:
            for shard, send in sorted(self.shards.items()):
                self._wait(shard, send, deadline)
                if send.answers:
                    pushed[shard] = send.answers[0]
                if send.receiver is not None:
                    pulled[shard] = send.receiver.finish()
        finally:
            self.abort()  # gives every stream back (closed if its step did not end well)
        answered = time.monotonic()
        first = min((t for send in sends.values() for t in send.sent[:1]), default=answered)
        communication = max(answered - first, 1e-9)
        overlap = min(1.0, max(0.0, (computed - first) / communication))
        return StepResult(push_result(pushed), self.client._pull_result(self.plan, pulled), overlap, communication)

    def _wait(self, shard: int, send: _ShardSend, deadline: float) -> None:
        assert send.future is not None
        try:
            send.future.result(max(0.001, deadline - time.monotonic()))
            send.stream.broken = False
        except concurrent.futures.TimeoutError:
            send.future.cancel()
            raise self.client._error(shard, self.what, StepTimeout(), 1, self.timeout) from None
        except grpc.RpcError as err:
            raise self.client._error(shard, self.what, err, 1, self.timeout) from None

    def abort(self) -> None:
        """Give back every shard's stream; one whose step did not end well is closed."""
        shards, self.shards = self.shards, {}
        for shard, send in shards.items():
            if send.future is not None and not send.future.done():
                send.future.cancel()
            self.client._pools[shard].give_back(send.stream)
