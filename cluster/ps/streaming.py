"""A step whose gradients leave while backprop goes on: communication hidden behind compute.

``ParameterClient.start_step`` returns a ``StreamedStep``. The replica hands
it each gradient the moment the executor has computed it (``push``); the step
packs gradients into messages of about ``FLUSH_BYTES`` and sends each on its
shard's held Step stream at once, from the step loop's background thread, while the
replica's thread goes on computing. ``finish`` sends the last message of each
shard (the pull after the push) and waits for the answers; or, in two
halves, ``send_last`` and then ``result``: between them the replica starts
its next step, and ``wait_for(name)`` holds it back at the first use of each
variable until that variable's pulled value has arrived (the pull hidden
behind the next step's compute).

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
import contextlib
import functools
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np

from cellgraph.protos import parameter_service_pb2 as pb

from ..errors import ParameterServerError
from . import fused
from .config import VariableSpec
from .frames import Framed, chunk_parts, length_delimited, parts_size
from .held import STEP_LOOP, HeldStream, PullPlan, ShardReceiver, StepTimeout, put_threadsafe
from .nonfinite import first_nonfinite
from .results import PullResult, PushResult, push_result
from .step_parts import pull_result
from .step_requests import _CHUNKS, _HEADER, _MORE, ONE_MESSAGE_BYTES, step_frames

if TYPE_CHECKING:
    from .client import ParameterClient

# Gradients are sent in messages of at least this many bytes (the last one of a shard may be smaller):
# big enough that a message's fixed cost is small beside its bytes, small enough to start early. Each message
# wakes the step loop's thread, which then competes with backprop for a core: with 16 KiB, the mini-Inception's
# 32 KB of gradients went in 3 messages and a 2-replica step on the shaped network took 7.4 ms against 6.3-6.5 ms
# in one (a 256 KiB message is 2 ms on a 1 Gbit/s link: a big model's gradients still leave during backprop).
FLUSH_BYTES = 256 * 1024
# How long a thread that sends a shard's whole step in one message runs the step loop for its write, at most
# (about 0.1 ms on a held stream here; a new stream's first write waits for its call to be set up too). Past it,
# the write goes on at the thread's next wait for the step, or whenever another thread runs the loop.
WRITE_S = 0.005


@dataclass(frozen=True)
class StepResult:
    """A finished step: what the shards did with the push, what was pulled, and the overlap."""

    pushed: PushResult
    pulled: PullResult
    overlap: float  # share of communication time that ran while the replica computed (0 to 1)
    communication_s: float  # from the first message sent to the last answer received


class Arrivals:
    """Which variables of a streamed step's pull have arrived whole (every piece, from every shard).

    The step loop's thread reports the pieces that came whole (``pieces``) and each shard's
    end (``shard_done``); the replica's thread waits for a variable
    (``wait``). A shard that ended without sending a piece it owed, or with
    an error, wakes every waiter: the step's ``result`` says why.
    """

    def __init__(self, plan: PullPlan) -> None:
        self._left = dict(plan.pieces_owed)  # pieces still to come, by variable
        self._owed = {shard: set(names) for shard, names in plan.owed.items()}  # by shard: its variables not whole
        self._lock = threading.Lock()
        self._awaited: dict[str, concurrent.futures.Future[None]] = {}  # done when that variable is whole
        self.failed = False
        self.waited_s = 0.0  # how long the replica's thread waited in ``wait``

    def pieces(self, shard: int, names: Sequence[str]) -> None:
        """``shard``'s pieces of ``names`` are whole (a fused chunk's members are told together, one lock)."""
        woken = []
        with self._lock:
            owed, left, awaited = self._owed.get(shard, set()), self._left, self._awaited
            for name in names:
                if name not in owed:  # told twice (a chunk of no bytes after the last): counted once
                    continue
                owed.discard(name)
                left[name] -= 1
                if left[name]:
                    continue
                del left[name]
                if name in awaited:
                    woken.append(awaited.pop(name))
        for future in woken:
            future.set_result(None)

    def shard_done(self, shard: int, ok: bool) -> None:
        with self._lock:
            if ok and not self._owed.get(shard):
                return
            self.failed = True
            awaited, self._awaited = list(self._awaited.values()), {}
        for future in awaited:
            future.set_result(None)

    def wait(self, name: str, deadline: float) -> bool:
        """Whether ``name`` arrived whole before ``deadline`` (False: the step failed or ran out of time).

        The waiting thread runs the step loop itself while nobody else does:
        it reads the answer it waits for, with no other thread to wake.
        """
        if name not in self._left:  # whole already: a name leaves ``_left`` once and never comes back, no lock
            return True
        with self._lock:
            if name not in self._left:
                return True
            if self.failed:
                return False
            awaited = self._awaited.setdefault(name, concurrent.futures.Future())
        began = time.monotonic()
        STEP_LOOP.wait(awaited, max(0.0, deadline - began))
        self.waited_s += time.monotonic() - began
        with self._lock:
            return name not in self._left


class _ShardSend:
    """One shard's part of a streamed step: its held stream, the frames not sent yet, its answer."""

    def __init__(self, shard: int, stream: HeldStream, receiver: ShardReceiver | None) -> None:
        self.shard = shard
        self.stream = stream
        self.receiver = receiver
        self.frames: asyncio.Queue[tuple[bytes, bool]] = asyncio.Queue()
        self.sent: list[float] = []
        self.parts: list[Any] = []
        self.small: list[tuple[VariableSpec, np.ndarray]] = []  # gradients fused when the message is made
        self.size = 0
        self.pushing = False  # a gradient of this shard was added: its first message carries the push's header
        self.started = False
        self.written: concurrent.futures.Future[None] = concurrent.futures.Future()  # done at the first write
        self.answers: list[pb.PushResponse] = []
        self.answered = 0.0  # when the answer's last message came (time.monotonic)
        self.future: concurrent.futures.Future[None] | None = None

    def wrote(self) -> None:  # after each frame's write (on the step loop), or once the step ended (any thread)
        with contextlib.suppress(concurrent.futures.InvalidStateError):  # said already
            self.written.set_result(None)

    def on_answer(self, framed: Framed[pb.StepResponse]) -> None:  # on the step loop
        if framed.message.HasField("push"):
            self.answers.append(framed.message.push)
        if self.receiver is not None and framed.message.values:
            self.receiver.add(framed, framed.message.values)
        if framed.message.last:
            self.answered = time.monotonic()


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
        # The first NaN or Inf among the step's gradients, checked here as each is pushed when the step goes to
        # several shards (which then do not check them): the last message tells each of them (nonfinite.py).
        self.watch_nonfinite = client.watches_nonfinite(len(client.addresses))
        self.nonfinite = ""
        self.header = pb.PushHeader(replica_id=replica_id, step=step, checked=self.watch_nonfinite).SerializeToString()
        self.what = f"push and pull of replica {replica_id} for step {step}"
        self.plan: PullPlan = client._pull_plan(names, replica_id, out)
        self.min_step = min_step
        self.timeout = timeout
        self.started = time.monotonic()
        self.grads: dict[str, np.ndarray] = {}
        self.shards: dict[int, _ShardSend] = {}
        self.arrivals = Arrivals(self.plan)
        self.homes = client.whole_homes()
        self.computed = 0.0  # when send_last was called: the replica's compute of this step was done

    def _shard(self, shard: int) -> _ShardSend:
        send = self.shards.get(shard)
        if send is None:
            self.client._stub(shard)  # channels of this process
            stream = self.client._pools[shard].take(self.client._metadata)
            receiver = (
                self.plan.receiver(shard, functools.partial(self.arrivals.pieces, shard))
                if shard in self.plan.requests
                else None
            )
            send = self.shards[shard] = _ShardSend(shard, stream, receiver)
        return send

    def push(self, name: str, grad: np.ndarray) -> None:
        """Send ``name``'s gradient (once its shard has ``FLUSH_BYTES`` waiting); checked like ``push``'s."""
        home = self.homes.get(name)
        if (
            home is not None
            and grad.__class__ is np.ndarray
            and grad.shape == home[1].shape
            and grad.flags.c_contiguous
        ):
            # The usual gradient: of a variable held whole by one shard, already as the wire takes it.
            pieces = {home[0]: [(home[1], grad)]}
        else:
            pieces = self.client._push_pieces({name: grad})  # checked there, and cut into each shard's rows
        self.grads[name] = grad
        if self.watch_nonfinite and not self.nonfinite:
            self.nonfinite = first_nonfinite(self.replica_id, self.step, [(name, grad)]) or ""
        for shard, items in pieces.items():
            send = self._shard(shard)
            for spec, piece in items:
                self._add(send, spec, piece)
            if send.size >= FLUSH_BYTES:
                self._flush(send, last=None)

    def _add(self, send: _ShardSend, spec: VariableSpec, piece: np.ndarray) -> None:
        send.pushing = True
        if fused.fusable(piece.nbytes):  # joined with the message's other small ones of its dtype at the flush
            if send.size and send.size + piece.nbytes > ONE_MESSAGE_BYTES:
                self._flush(send, last=None)
            send.small.append((spec, piece))
            send.size += piece.nbytes
            return
        if piece.nbytes:  # the small ones before it go first, as fused.tensor_chunk_parts orders them
            self._fuse_small(send)
        for chunk in chunk_parts(spec.name, piece, self.client.max_chunk_bytes):
            field = length_delimited(_CHUNKS, chunk)
            nbytes = parts_size(field)
            if send.size and send.size + nbytes > ONE_MESSAGE_BYTES:
                # A message stays under gRPC's limit: a gradient bigger than one goes in several.
                self._flush(send, last=None)
            send.parts += field
            send.size += nbytes

    def _fuse_small(self, send: _ShardSend) -> None:
        """Move the small gradients held back for fusing into the message, fused (their bytes are counted in
        ``send.size`` already), in the shard's order: as its store holds them, they are summed and applied
        whole there."""
        if len(send.small) > 1:
            order = self.client.layout_order()
            send.small.sort(key=lambda item: order[item[0].name])
        for chunk in fused.tensor_chunk_parts(send.small, self.client.max_chunk_bytes):
            send.parts += length_delimited(_CHUNKS, chunk)
        send.small = []

    def _flush(self, send: _ShardSend, last: bytes | None) -> None:
        """Send what ``send`` holds (and, with ``last``, the step's last message's own fields)."""
        head = length_delimited(_HEADER, [self.header]) if send.pushing and not send.started else []
        tail = [last] if last is not None else [_MORE]
        self._fuse_small(send)
        frame = b"".join([*head, *send.parts, *tail])
        send.parts, send.size = [], 0
        item = (frame, last is not None)

        def start(submit: Any, here: bool) -> None:
            if not send.started:
                send.started = True
                send.future = send.stream.start_streamed(send.frames, send.on_answer, send.sent, submit, send.wrote)
                send.future.add_done_callback(
                    lambda done: self.arrivals.shard_done(send.shard, not done.cancelled() and done.exception() is None)
                )
                send.future.add_done_callback(lambda _: send.wrote())  # a step that failed before its write
            if here:
                send.frames.put_nowait(item)
            else:
                put_threadsafe(send.frames, item)

        if last is not None and not send.started:
            # The shard's whole step is this one message, and this thread waits for its answer next (wait_for,
            # result): it writes the message itself, and reads the answer as it waits; no other thread is woken.
            # A step sent in several messages (a big model's gradients, during backprop) is run by the loop's
            # background thread, which keeps its bytes moving while this thread computes.
            STEP_LOOP.drive(start, send.written, WRITE_S)
        else:
            start(STEP_LOOP.submit, False)

    def finish(self) -> StepResult:
        """Send every shard's last message (the pull) and wait for the answers, within the step's deadline."""
        self.send_last()
        return self.result()

    def send_last(self) -> None:
        """Send every shard's last message (the pull after the push); the answers arrive meanwhile."""
        self.computed = time.monotonic()
        missing = [name for name in self.client._need_layout() if name not in self.grads]
        if missing and self.grads:
            self.abort()
            raise ParameterServerError(
                f"{self.what}: no gradient was pushed for {', '.join(map(repr, missing))}", "INVALID_ARGUMENT"
            )
        deadline = self.started + self.timeout
        for shard in sorted(set(self.shards) | set(self.plan.requests)):
            send = self._shard(shard)
            request = self.plan.wire_for(shard, self.min_step) if shard in self.plan.wire else None
            left = max(0.001, deadline - time.monotonic())
            # The last message's own fields: step_frames' tail (the pull, the server's wait) without a push.
            nonfinite = self.nonfinite if send.pushing else ""
            [tail] = step_frames([], None, request, 0.9 * left, self.client.max_chunk_bytes, nonfinite)
            self._flush(send, last=tail)

    def wait_for(self, name: str) -> bool:
        """Wait until variable ``name``'s pulled value is whole (after ``send_last``), within the step's deadline;
        False when the step failed or ran out of time (``result`` raises why)."""
        return self.arrivals.wait(name, self.started + self.timeout)

    def result(self, next_started: float | None = None) -> StepResult:
        """Wait for every shard's answer (after ``send_last``), within the step's deadline.

        ``next_started``: when the replica's next step began computing (it read
        this pull's values as they arrived); the overlap then counts the time
        it computed while this answer was on the wire, less its waits for
        values in ``wait_for``.
        """
        deadline = self.started + self.timeout
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
        answered = max((send.answered for send in sends.values()), default=0.0) or time.monotonic()
        first = min((t for send in sends.values() for t in send.sent[:1]), default=answered)
        communication = max(answered - first, 1e-9)
        busy = self.computed - first
        if next_started is not None:
            busy += max(0.0, answered - next_started) - self.arrivals.waited_s
        overlap = min(1.0, max(0.0, busy / communication))
        return StepResult(push_result(pushed), pull_result(self.plan, pulled), overlap, communication)

    def _wait(self, shard: int, send: _ShardSend, deadline: float) -> None:
        assert send.future is not None
        try:
            STEP_LOOP.wait(send.future, max(0.001, deadline - time.monotonic()))  # runs the loop if nobody does
            send.future.result(0)
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
