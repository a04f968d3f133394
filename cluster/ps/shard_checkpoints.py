"""A shard's checkpoints on its server: ``Save`` and ``Restore``, and the job's own every ``checkpoint_every`` steps.

``ShardCheckpoints`` is what the servicer knows about checkpoints: the
directory they go to (a server started without one refuses ``Save`` and
``Restore`` with FAILED_PRECONDITION), how many are kept, the background
writer of a job that checkpoints by itself (``autosave.py``), and the newest
one written and how many were, for ``Stats`` (the retention deletes old ones,
so they are counted, not listed). Writing and reading run on a thread: the
event loop goes on serving, health checks included, while the disk works;
one write or restore runs at a time.

The file format is ``checkpoint.py``'s; this module decides when a shard's
state is written and checks that a checkpoint read back holds exactly the
job's variables before the store loads it.

Examples
--------
>>> import asyncio, tempfile
>>> import numpy as np
>>> from pathlib import Path
>>> from .config import OptimizerConfig, TrainingConfig, VariableSpec
>>> from .store import ParameterStore
>>> spec = VariableSpec("w", np.dtype("float32"), (2,))
>>> store = ParameterStore("job", [spec], {"w": np.ones(2, np.float32)}, OptimizerConfig(), TrainingConfig())
>>> job = pb.JobConfig(job_id="job", shard=0, num_shards=1)
>>> with tempfile.TemporaryDirectory() as directory:
...     checkpoints = ShardCheckpoints(Path(directory), keep=5)
...     saved = asyncio.run(checkpoints.save(job, store))
...     restored = asyncio.run(checkpoints.restore(job, store, ""))  # "": the newest complete one
>>> saved.checkpoint, saved.global_step, saved.bytes, checkpoints.latest, checkpoints.written
('ckpt-0000000000', 0, 8, ('ckpt-0000000000', 0), 1)
>>> restored.checkpoint
'ckpt-0000000000'
>>> ShardCheckpoints(None, keep=5).need_directory()
Traceback (most recent call last):
...
cellgraph.cluster.errors.ParameterServerError: this parameter server has no checkpoint directory: ...
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cellgraph.protos import parameter_service_pb2 as pb

from ..errors import ParameterServerError
from . import checkpoint
from .autosave import CheckpointWriter
from .checkpoint import CheckpointInfo
from .config import quoted
from .records import StoreState
from .shard_init import MAX_ID_CHARS
from .store import ParameterStore


class ShardCheckpoints:
    """One shard's checkpoints in ``directory`` (None: this server takes none), the newest ``keep`` kept."""

    def __init__(self, directory: Path | None, keep: int) -> None:
        self.directory = directory
        self.keep = keep
        # The job's own checkpoints (checkpoint_every), made at Init. A plain attribute: a push awaits it
        # (ParameterServicer.before_push) at the cost of one lookup, no call of its own.
        self.writer: CheckpointWriter | None = None
        self.latest: tuple[str, int] = ("", -1)  # the newest checkpoint written: name, global step
        self.written = 0  # checkpoints written for the job; the retention deletes old ones, so they are counted
        self._lock = threading.Lock()  # one Save or Restore at a time

    def need_directory(self) -> Path:
        """The checkpoint directory; FAILED_PRECONDITION if this server has none."""
        if self.directory is None:
            raise ParameterServerError(
                "this parameter server has no checkpoint directory: start it with checkpoint_dir=... "
                "(`cellgraph ps --checkpoint-dir DIR`)",
                "FAILED_PRECONDITION",
            )
        return self.directory

    def start(self, job: pb.JobConfig, store: ParameterStore) -> None:
        """Start the background writer of a job that checkpoints by itself (its store was just made at Init)."""
        if store.training.checkpoint_every > 0:
            self.writer = CheckpointWriter(
                # self.write looked up at each write, not bound now: a test slows the disk by replacing it.
                lambda state: self.write(job, store, state).name,
                f"cellgraph-ps-checkpoints-{job.job_id}-{job.shard}",
            )

    @property
    def error(self) -> str:
        """Why the last background checkpoint failed or was late ("" if it did not)."""
        return self.writer.error if self.writer is not None else ""

    async def save(self, job: pb.JobConfig, store: ParameterStore) -> pb.SaveResponse:
        """Write the shard's state now (the Save RPC)."""
        self.need_directory()
        state = store.state()  # a consistent snapshot; training goes on while it is written
        # Written by a thread: the event loop goes on serving (health checks included) while the disk works.
        info = await asyncio.to_thread(self.write, job, store, state)
        nbytes = sum(t.nbytes for t in state.tensors.values())
        return pb.SaveResponse(checkpoint=info.name, global_step=state.global_step, bytes=nbytes)

    def write(self, job: pb.JobConfig, store: ParameterStore, state: StoreState) -> CheckpointInfo:
        """Write ``state`` as this shard's checkpoint (one write at a time) and remember it as the latest."""
        with self._lock:
            info = checkpoint.write_shard_checkpoint(
                self.need_directory(),
                job_id=job.job_id,
                shard=job.shard,
                num_shards=job.num_shards,
                global_step=state.global_step,
                tensors=state.tensors,
                versions=state.versions,
                specs=list(store.specs.values()),
                optimizer=store.optimizer,
                training=store.training,
                keep=self.keep,
            )
            self.written += 1
            if state.global_step >= self.latest[1]:
                self.latest = (info.name, state.global_step)
        return info

    def offer_due(self, store: ParameterStore) -> None:
        """Hand the state copied at a multiple of ``checkpoint_every`` (if any) to the background writer."""
        snapshot = store.take_snapshot()
        if snapshot is not None and self.writer is not None:
            self.writer.offer(snapshot)

    async def restore(self, job: pb.JobConfig, store: ParameterStore, name: str) -> pb.RestoreResponse:
        """Load checkpoint ``name`` ("": the newest complete one) into ``store`` (the Restore RPC)."""
        directory = self.need_directory()
        if len(name) > MAX_ID_CHARS:
            raise ParameterServerError(
                f"checkpoint name {quoted(name)} is longer than {MAX_ID_CHARS} characters", "INVALID_ARGUMENT"
            )
        return await asyncio.to_thread(self._restore, job, store, directory, name)

    def _restore(self, job: pb.JobConfig, store: ParameterStore, directory: Path, name: str) -> pb.RestoreResponse:
        """Read a checkpoint and load it (a thread's work: reading is slow); waiters end with ABORTED."""
        with self._lock:
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

    def close(self) -> None:
        """Let a background checkpoint in progress finish (the server is stopping)."""
        if self.writer is not None:
            self.writer.close()


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
