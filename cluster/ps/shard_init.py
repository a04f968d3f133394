"""A shard's Init: one at a time, the job's config checked, its initial values assembled into a store.

An Init stream brings a job's config, then the initial values of the shard's
variables in chunks. ``ShardInit`` turns it into the shard's
``ParameterStore``. It lets one Init in at a time (``turn``): a second one
waits at most ``init_wait_s``, within its caller's deadline, and is then told
whose Init it waited for, so one stalled client cannot block the next
forever. It checks the whole config (job id, shard, variables, layout, the
bytes against this server's limit and this machine's free memory) before it
allocates anything, then assembles each variable as its chunks arrive.

It is kept apart from ``ParameterServicer`` because none of it runs after
Init: the servicer keeps the store it gets and serves the shard's traffic.
What an Init means for a server that already holds a job is
``refuse_other_job``.

Examples
--------
>>> import asyncio
>>> import numpy as np
>>> from .chunks import tensor_chunks
>>> from .config import VariableSpec
>>> from .door import Counters
>>> from .messages import spec_to_proto
>>> config = pb.JobConfig(
...     job_id="job", shard=0, num_shards=1,
...     variables=[spec_to_proto(VariableSpec("w", np.dtype("float32"), (3,)))],
...     optimizer=pb.OptimizerConfigProto(kind="sgd", learning_rate=0.1),
...     training=pb.TrainingConfigProto(mode=pb.ASYNC, replicas_to_aggregate=1))
>>> async def values():  # the Init stream after its config, as door.client_stream yields it
...     for chunk in tensor_chunks("w", np.arange(3, dtype=np.float32)):
...         yield Framed(pb.InitMessage(chunk=chunk), [memoryview(chunk.content)])
>>> init = ShardInit(Counters(), max_chunk_bytes=1 << 20, max_bytes=1 << 30, init_wait_s=1.0)
>>> store = asyncio.run(init.build_store(config, values()))
>>> store.read()
(0, {'w': (0, array([0., 1., 2.], dtype=float32))})
>>> init.counters.bytes_in
12
>>> config.shard = 1
>>> asyncio.run(init.build_store(config, values()))
Traceback (most recent call last):
...
cellgraph.cluster.errors.ParameterServerError: shard 1 is not in [0, 1) (num_shards)
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

from cellgraph.protos import parameter_service_pb2 as pb
from cellgraph.protos import tensor_pb2

from ..errors import ParameterServerError
from .chunks import TensorAssembler, release_all
from .config import SCALAR_SLOTS, OptimizerConfig, listed, quoted
from .door import Context, Counters, available_memory, check_chunk_size
from .frames import Framed
from .messages import optimizer_from_proto, spec_from_proto, training_from_proto
from .store import ParameterStore

# How often an Init waiting for another one looks again whether it has finished.
INIT_POLL_S = 0.01
# The longest job id and checkpoint name taken: both are repeated in messages.
MAX_ID_CHARS = 200


def refuse_other_job(held: pb.JobConfig, config: pb.JobConfig) -> None:
    """Refuse an Init of ``config`` on a server that holds ``held``, unless it is the very same job and config
    (then the Init is harmless: the client re-initialising after another shard restarted)."""
    if held.SerializeToString(deterministic=True) != config.SerializeToString(deterministic=True):
        other = "the same job id with a different config" if held.job_id == config.job_id else None
        raise ParameterServerError(
            f"this parameter server already holds job {quoted(held.job_id)}"
            + (f" ({other})" if other else f"; job {quoted(config.job_id)} needs a server of its own"),
            "FAILED_PRECONDITION",
        )


class ShardInit:
    """One Init at a time (``turn``), and the store built from its stream (``build_store``).

    ``counters`` is the servicer's: the initial values' bytes count as bytes in.
    """

    def __init__(self, counters: Counters, *, max_chunk_bytes: int, max_bytes: int, init_wait_s: float) -> None:
        self.counters = counters
        self.max_chunk_bytes = max_chunk_bytes
        self.max_bytes = max_bytes
        self.init_wait_s = init_wait_s
        # A thread lock taken without blocking (turn polls it), so that waiting for it holds no thread and a
        # cancelled wait can never leave it taken.
        self._lock = threading.Lock()
        self._holder: tuple[str, float] = ("", 0.0)  # the Init holding the lock: job id, monotonic start

    @contextlib.asynccontextmanager
    async def turn(self, job_id: str, context: Context) -> AsyncIterator[None]:
        """Hold the Init lock, waiting for another Init at most ``init_wait_s`` (and within the caller's deadline)."""
        remaining = context.time_remaining()
        wait = self.init_wait_s if remaining is None else max(0.0, min(0.9 * remaining, self.init_wait_s))
        deadline = time.monotonic() + wait
        while not self._lock.acquire(blocking=False):
            if time.monotonic() >= deadline:
                holder, since = self._holder
                raise ParameterServerError(
                    f"waited {wait:g} s for another Init (of job {quoted(holder)}, in progress for "
                    f"{time.monotonic() - since:.1f} s) to finish; Init of job {quoted(job_id)} not started: "
                    "retry once that one has finished or failed",
                    "DEADLINE_EXCEEDED",
                )
            await asyncio.sleep(INIT_POLL_S)
        try:
            self._holder = (job_id, time.monotonic())
            yield
        finally:
            self._lock.release()

    async def build_store(
        self, config: pb.JobConfig, messages: AsyncIterator[Framed[pb.InitMessage]]
    ) -> ParameterStore:
        """The store of ``config``'s shard, its initial values the chunks of ``messages`` (the Init stream after
        its config). The config is checked whole before any buffer is made; a refusal names what was wrong."""
        try:
            return await self._assemble(config, messages)
        except MemoryError as err:  # the estimate of _check_memory was not enough: still the client's problem
            raise ParameterServerError(
                f"job {quoted(config.job_id)} does not fit in this parameter server's memory ({err}); "
                f"{available_memory() or 0:,} bytes are available now",
                "RESOURCE_EXHAUSTED",
            ) from None

    async def _assemble(self, config: pb.JobConfig, messages: AsyncIterator[Framed[pb.InitMessage]]) -> ParameterStore:
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
        self._check_memory(job, config.shard, total, optimizer, training.mode)
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

    def _check_memory(self, job: str, shard: int, variables: int, opt: OptimizerConfig, mode: str) -> None:
        """Refuse a job whose shard would not fit in this machine's free memory, before allocating any of it."""
        available = available_memory()
        if available is None:
            return
        optimizer = opt.kind
        slots = [slot for slot in opt.slots() if slot not in SCALAR_SLOTS[optimizer]]  # a scalar is no copy
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
