"""A parameter server killed with SIGKILL in the middle of a large save: the last complete checkpoint still restores."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from cellgraph.cluster.errors import ParameterServerError
from cellgraph.cluster.ps import OptimizerConfig, ParameterClient
from cellgraph.cluster.ps.checkpoint import latest_checkpoint, list_checkpoints

from .conftest import TIMEOUT
from .processes import PsProcess, cellgraph_ps

JOB = "crash"
ELEMENTS = 13_107_200  # float32 elements per variable: 2 x 50 MiB of state
NAMES = ("embedding", "dense")
LEARNING_RATE = 0.5
SAVE_TIMEOUT = 120.0  # seconds for one save of 100 MiB, fsync included, on a slow disk
MID_WRITE_BYTES = 1 << 20  # a checkpoint folder holding this much, with no manifest yet, is being written
ATTEMPTS = 3  # saves to try to catch mid-write before giving up
COMMITTED = re.compile(r"ckpt-[0-9]{10}/shard-0-of-1\.(json|safetensors)")


def initial() -> dict[str, np.ndarray]:
    """The job's initial values: the same on every call, so that two servers can be given the same job."""
    rng = np.random.default_rng(7)
    return {name: rng.standard_normal(ELEMENTS, dtype=np.float32) for name in NAMES}


def digest(values: dict[str, np.ndarray]) -> dict[str, str]:
    """Each variable's dtype, shape and sha256 of its bytes: equal digests are bit-exact equal values."""
    return {
        name: f"{value.dtype}{value.shape}:{hashlib.sha256(np.ascontiguousarray(value).data).hexdigest()}"
        for name, value in values.items()
    }


def push_one(client: ParameterClient, step: int) -> int:
    """Push a gradient of ones for ``step``; the global step after it."""
    result = client.push({name: np.ones(ELEMENTS, np.float32) for name in NAMES}, step=step, replica_id=0)
    assert result.status == "applied"
    return result.global_step


def allocated_bytes(folder: Path) -> int:
    """Bytes on disk under ``folder``, staging files and folders included (0 when it does not exist yet)."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except FileNotFoundError:  # renamed or removed between the listing and the stat
                pass
    return total


def leftovers(directory: Path) -> list[str]:
    """Everything under ``directory`` that is not a committed checkpoint's data file or manifest."""
    found = []
    for root, folders, files in os.walk(directory):
        for name in files + [f for f in folders if root != str(directory)]:
            relative = os.path.relpath(os.path.join(root, name), directory)
            if not COMMITTED.fullmatch(relative):
                found.append(relative)
    return sorted(found)


def kill_during_save(server: PsProcess, client: ParameterClient, folder: Path) -> list[BaseException] | None:
    """Start a save, SIGKILL ``server`` once ``folder`` is being written; the save's errors, None if it finished first."""
    errors: list[BaseException] = []

    def save() -> None:
        try:
            client.save()
        except BaseException as err:  # noqa: BLE001 - inspected by the test
            errors.append(err)

    saving = threading.Thread(target=save, daemon=True)
    saving.start()
    deadline = time.monotonic() + SAVE_TIMEOUT
    try:
        while time.monotonic() < deadline:
            if (folder / "shard-0-of-1.json").exists():
                return None  # committed before the poll saw enough of it being written
            written = allocated_bytes(folder)
            if written >= MID_WRITE_BYTES:
                os.kill(server.pid, signal.SIGKILL)
                print(f"SIGKILL with {written:,} bytes under {folder.name}, no manifest yet")
                return errors
            time.sleep(0.0005)
        pytest.fail(f"the save wrote nothing under {folder} within {SAVE_TIMEOUT} s")
    finally:
        saving.join(SAVE_TIMEOUT)
        assert not saving.is_alive(), "the save hung"


@pytest.mark.slow
def test_kill_9_during_a_large_save_then_restore(tmp_path: Path) -> None:
    directory = tmp_path / "ckpt"
    with cellgraph_ps("--no-auth", "--checkpoint-dir", directory) as first:
        client = ParameterClient([first.address], None, timeout=SAVE_TIMEOUT, retries=2)
        assert client.init(JOB, initial(), OptimizerConfig("sgd", learning_rate=LEARNING_RATE)) == 0
        client.register(0)
        assert client.save() == "ckpt-0000000000"
        saved_step, saved = 0, digest(initial())
        for attempt in range(ATTEMPTS):
            step = push_one(client, saved_step)  # the state now differs from the last checkpoint
            killed_folder = directory / f"ckpt-{step:010d}"
            errors = kill_during_save(first, client, killed_folder)
            if errors is not None:
                print(f"caught save {attempt + 1} of at most {ATTEMPTS} mid-write")
                break
            # The save was too quick to catch: it is the last complete checkpoint now; try the next one.
            saved_step, saved = step, digest(client.pull().values)
        else:
            pytest.fail(f"{ATTEMPTS} saves of {2 * ELEMENTS * 4:,} bytes each finished before the poll caught one")
        client.close()
        assert first.proc.wait(TIMEOUT) == -signal.SIGKILL

    assert len(errors) == 1 and isinstance(errors[0], ParameterServerError), errors
    assert errors[0].code == "UNAVAILABLE"
    assert re.match(rf"parameter server {re.escape(first.address)} \(shard 0\) did not answer Save", str(errors[0]))
    # The killed write left its partial data behind, uncommitted; the last complete checkpoint is untouched.
    assert not (killed_folder / "shard-0-of-1.json").exists()
    assert allocated_bytes(killed_folder) > 0
    latest = latest_checkpoint(directory, 0, 1)
    assert latest is not None and latest.step == saved_step
    left = leftovers(directory)
    print(f"the kill left: {left}")
    assert left != []

    with cellgraph_ps("--no-auth", "--checkpoint-dir", directory) as second:
        with ParameterClient([second.address], None, timeout=SAVE_TIMEOUT, retries=2) as client:
            assert client.init(JOB, initial(), OptimizerConfig("sgd", learning_rate=LEARNING_RATE)) == 0
            client.register(0)
            assert push_one(client, 0) == 1  # so that the restore has something to undo
            assert client.restore() == saved_step
            pulled = client.pull()
            assert (pulled.global_step, pulled.versions) == (saved_step, dict.fromkeys(NAMES, saved_step))
            assert digest(pulled.values) == saved
            del pulled
            # The next save writes the very step the kill interrupted, into the folder it left, and tidies up.
            step = push_one(client, saved_step)
            assert client.save() == f"ckpt-{step:010d}" == killed_folder.name
        assert [c.step for c in list_checkpoints(directory, 0, 1)] == sorted({0, saved_step, step})
        assert leftovers(directory) == []
        assert second.stop() == (0, "cellgraph ps: stopped")
