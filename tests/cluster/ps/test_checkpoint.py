"""Shard checkpoints: bit-exact round trips, files other tools read, pruning, and surviving a SIGKILL."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
import safetensors
import safetensors.numpy

from cellgraph.cluster.errors import ParameterServerError
from cellgraph.cluster.ps.checkpoint import (
    CheckpointInfo,
    latest_checkpoint,
    list_checkpoints,
    read_shard_checkpoint,
    write_shard_checkpoint,
)
from cellgraph.cluster.ps.config import OptimizerConfig, TrainingConfig, VariableSpec

DEADLINE_S = 30.0
T = TypeVar("T")


def shard_state() -> dict[str, Any]:
    """One shard of an Adam job: a split float32 matrix and an unsplit 0-d float64, with their slots."""
    # Bits a lossy writer would lose: a NaN payload, -0.0, inf, a float32 denormal.
    payload_nan = np.array([0x7FC00123], np.uint32).view(np.float32)[0]
    w = np.array([[1.5, -0.0, payload_nan], [np.inf, 1e-45, -3.25]], np.float32)
    b = np.array(np.pi, np.float64)
    tensors = {
        "w": w,
        "w/m": (w * 0.5).astype(np.float32),
        "w/v": np.full((2, 3), 1 / 3, np.float32),
        "w/t": np.array(7.0),
        "b": b,
        "b/m": np.array(-1e-300),
        "b/v": np.array(5e-324),  # the smallest float64 denormal
        "b/t": np.array(7.0),
    }
    return {
        "job_id": "job-42",
        "shard": 0,
        "num_shards": 2,
        "global_step": 120,
        "tensors": tensors,
        "versions": {"w": 11, "b": 3},
        "specs": [
            VariableSpec("w", np.dtype(np.float32), (2, 3), full_shape=(4, 3), rows=(0, 2)),
            VariableSpec("b", np.dtype(np.float64), ()),
        ],
        "optimizer": OptimizerConfig(kind="adam", learning_rate=1e-3, beta2=0.98, epsilon=1e-7),
        "training": TrainingConfig(mode="sync", replicas_to_aggregate=3, max_staleness=None),
    }


def save(directory: Path, **overrides: Any) -> CheckpointInfo:
    return write_shard_checkpoint(directory, **{**shard_state(), **overrides})


def one_variable(value: float, step: int, shard: int = 0, num_shards: int = 1) -> dict[str, Any]:
    w = np.full((4,), value, np.float32)
    return {
        "tensors": {"w": w},
        "versions": {"w": step},
        "specs": [VariableSpec("w", w.dtype, w.shape)],
        "global_step": step,
        "shard": shard,
        "num_shards": num_shards,
    }


def assert_bit_exact(actual: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert actual.keys() == expected.keys()
    for name, want in expected.items():
        got = actual[name]
        assert (got.dtype, got.shape) == (want.dtype, want.shape), name
        assert got.tobytes() == want.tobytes(), name


def raises(code: str, *words: str) -> Callable[[Callable[[], object]], ParameterServerError]:
    def check(call: Callable[[], object]) -> ParameterServerError:
        with pytest.raises(ParameterServerError) as caught:
            call()
        assert caught.value.code == code, str(caught.value)
        for word in words:
            assert word in str(caught.value), (word, str(caught.value))
        return caught.value

    return check


def names(directory: Path, shard: int = 0, num_shards: int = 2) -> list[str]:
    return [info.name for info in list_checkpoints(directory, shard, num_shards)]


# ---------------------------------------------------------------------- round trip and format
def test_round_trip_is_bit_exact(tmp_path: Path) -> None:
    state = shard_state()
    info = save(tmp_path)
    assert info == CheckpointInfo("ckpt-0000000120", 120, 0, 2, tmp_path)

    ckpt = read_shard_checkpoint(tmp_path, "ckpt-0000000120", 0, 2)
    assert_bit_exact(ckpt.tensors, state["tensors"])
    assert ckpt.info == info
    assert (ckpt.job_id, ckpt.global_step, ckpt.versions) == ("job-42", 120, {"w": 11, "b": 3})
    assert ckpt.specs == state["specs"]
    assert (ckpt.optimizer, ckpt.training) == (state["optimizer"], state["training"])
    # The store updates restored values in place.
    assert all(a.flags.writeable for a in ckpt.tensors.values())


def test_strided_views_are_saved_by_value(tmp_path: Path) -> None:
    w = np.arange(12, dtype=np.float64).reshape(3, 4).T  # Fortran-ordered view
    save(tmp_path, tensors={"w": w}, versions={}, specs=[VariableSpec("w", w.dtype, w.shape)])
    ckpt = read_shard_checkpoint(tmp_path, "ckpt-0000000120", 0, 2)
    assert_bit_exact(ckpt.tensors, {"w": np.ascontiguousarray(w)})


def test_files_are_plain_safetensors_and_json(tmp_path: Path) -> None:
    info = save(tmp_path)
    data = tmp_path / "ckpt-0000000120" / "shard-0-of-2.safetensors"
    manifest_file = tmp_path / "ckpt-0000000120" / "shard-0-of-2.json"
    assert (info.data_file, info.manifest_file) == (data, manifest_file)
    assert sorted(p.name for p in info.path.iterdir()) == ["shard-0-of-2.json", "shard-0-of-2.safetensors"]

    assert_bit_exact(safetensors.numpy.load_file(data), shard_state()["tensors"])
    with safetensors.safe_open(data, framework="np") as f:
        assert f.metadata() == {"job_id": "job-42", "global_step": "120", "shard": "0", "num_shards": "2"}

    manifest = json.loads(manifest_file.read_text())
    assert manifest["format"] == "cellgraph-ps-checkpoint"
    assert manifest["format_version"] == 1
    assert (manifest["job_id"], manifest["shard"], manifest["num_shards"]) == ("job-42", 0, 2)
    assert (manifest["global_step"], manifest["versions"]) == (120, {"w": 11, "b": 3})
    assert manifest["tensors"]["w"] == {"dtype": "float32", "shape": [2, 3]}
    assert manifest["tensors"]["w/t"] == {"dtype": "float64", "shape": []}
    assert manifest["specs"][0] == {
        "name": "w",
        "dtype": "float32",
        "shape": [2, 3],
        "full_shape": [4, 3],
        "rows": [0, 2],
        "moving": False,
        "moving_momentum": 0.0,
    }
    assert manifest["optimizer"]["kind"] == "adam" and manifest["training"]["mode"] == "sync"
    assert manifest["file"] == {
        "name": "shard-0-of-2.safetensors",
        "size": data.stat().st_size,
        "sha256": hashlib.sha256(data.read_bytes()).hexdigest(),
    }
    assert manifest["written_at"].endswith("+00:00")  # UTC


def test_rewriting_a_step_replaces_it(tmp_path: Path) -> None:
    save(tmp_path, **one_variable(1.0, step=5))
    save(tmp_path, **one_variable(2.0, step=5))
    assert names(tmp_path, 0, 1) == ["ckpt-0000000005"]
    ckpt = read_shard_checkpoint(tmp_path, "ckpt-0000000005", 0, 1)
    assert_bit_exact(ckpt.tensors, {"w": np.full((4,), 2.0, np.float32)})


# ---------------------------------------------------------------------- listing and pruning
def test_keep_prunes_the_oldest(tmp_path: Path) -> None:
    for step in range(1, 7):
        save(tmp_path, keep=3, **one_variable(step, step))
    assert names(tmp_path, 0, 1) == ["ckpt-0000000004", "ckpt-0000000005", "ckpt-0000000006"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-0000000004", "ckpt-0000000005", "ckpt-0000000006"]
    latest = latest_checkpoint(tmp_path, 0, 1)
    assert latest is not None and latest.step == 6


def test_pruning_touches_only_this_shards_files(tmp_path: Path) -> None:
    save(tmp_path, keep=1, **one_variable(1.0, step=1, shard=1, num_shards=2))
    for step in (1, 2, 3):
        save(tmp_path, keep=1, **one_variable(step, step, shard=0, num_shards=2))
    assert names(tmp_path, 0, 2) == ["ckpt-0000000003"]
    assert names(tmp_path, 1, 2) == ["ckpt-0000000001"]
    # Step 1's folder stays while shard 1 has files there; step 2's went with shard 0's last file.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-0000000001", "ckpt-0000000003"]
    assert sorted(p.name for p in (tmp_path / "ckpt-0000000001").iterdir()) == [
        "shard-1-of-2.json",
        "shard-1-of-2.safetensors",
    ]


def test_keep_always_counts_the_checkpoint_just_written(tmp_path: Path) -> None:
    # A shard restored from an older step and saving again must not delete what it just wrote.
    for step in (10, 20, 5):
        save(tmp_path, keep=2, **one_variable(step, step))
    assert names(tmp_path, 0, 1) == ["ckpt-0000000005", "ckpt-0000000020"]


def test_listing_skips_what_is_not_committed(tmp_path: Path) -> None:
    assert list_checkpoints(tmp_path / "missing", 0, 2) == []
    assert latest_checkpoint(tmp_path / "missing", 0, 2) is None

    good = save(tmp_path, global_step=1)
    for step in (2, 3, 4, 5, 6):
        save(tmp_path, global_step=step, keep=10)
    # 2: data without a manifest (killed between the two renames).
    (tmp_path / "ckpt-0000000002" / "shard-0-of-2.json").unlink()
    # 3: truncated data.
    with open(tmp_path / "ckpt-0000000003" / "shard-0-of-2.safetensors", "r+b") as f:
        f.truncate(100)
    # 4: only a staging folder (killed before the first rename), holding
    # safetensors' own partial file and a finished one not yet renamed out.
    staging = tmp_path / "ckpt-0000000004" / ".shard-0-of-2.safetensors.0123abcd.tmp"
    staging.mkdir()
    (staging / ".tmpAbC123").write_bytes(b"partial")
    (tmp_path / "ckpt-0000000004" / "shard-0-of-2.safetensors").rename(staging / "shard-0-of-2.safetensors")
    (tmp_path / "ckpt-0000000004" / "shard-0-of-2.json").unlink()
    # 5: a manifest that does not parse.
    (tmp_path / "ckpt-0000000005" / "shard-0-of-2.json").write_text('{"format": "cellgraph-ps-ch')
    # 6 stays complete; a copy under another step's name does not count, nor do stray names.
    shutil.copytree(tmp_path / "ckpt-0000000006", tmp_path / "ckpt-0000000007")
    (tmp_path / "ckpt-8").mkdir()
    (tmp_path / "notes.txt").write_text("not a checkpoint")

    assert names(tmp_path) == [good.name, "ckpt-0000000006"]
    assert names(tmp_path, 1, 2) == []  # another shard's view: none of these files are its own
    raises("FAILED_PRECONDITION", "ckpt-0000000007", "damaged", "global_step is 6", "say 7")(
        lambda: read_shard_checkpoint(tmp_path, "ckpt-0000000007", 0, 2)
    )


def test_next_write_removes_only_its_own_leftovers(tmp_path: Path) -> None:
    save(tmp_path, global_step=1)
    old = tmp_path / "ckpt-0000000001"
    mine = [old / ".shard-0-of-2.safetensors.deadbeef.tmp", old / ".shard-0-of-2.json.deadbeef.tmp"]
    theirs = old / ".shard-1-of-2.safetensors.deadbeef.tmp"  # shard 1 may be mid-write right now
    for staging in [*mine, theirs]:
        staging.mkdir()
        (staging / ".tmpAbC123").write_bytes(b"partial")
    (tmp_path / "ckpt-0000000002").mkdir()
    orphan = tmp_path / "ckpt-0000000002" / "shard-0-of-2.safetensors"  # renamed, never committed
    orphan.write_bytes(b"uncommitted")

    save(tmp_path, global_step=3)
    assert not any(p.exists() for p in mine) and theirs.exists()
    assert not (tmp_path / "ckpt-0000000002").exists()
    assert names(tmp_path) == ["ckpt-0000000001", "ckpt-0000000003"]


# ---------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    "name",
    ["../ckpt-0000000120", "/etc/passwd", "ckpt-120", "ckpt-00000001200", "ckpt-0000000120/..", "ckpt-000000012٠", ""],
)
def test_names_that_are_not_checkpoint_names_are_refused(tmp_path: Path, name: str) -> None:
    save(tmp_path)
    raises("INVALID_ARGUMENT", repr(name), "is not a checkpoint name", "ckpt-0000000120")(
        lambda: read_shard_checkpoint(tmp_path, name, 0, 2)
    )


def test_missing_checkpoint_names_what_exists(tmp_path: Path) -> None:
    raises("NOT_FOUND", "ckpt-0000000007", "not found in", str(tmp_path), "complete checkpoints there: none")(
        lambda: read_shard_checkpoint(tmp_path, "ckpt-0000000007", 0, 2)
    )
    save(tmp_path, global_step=1)
    save(tmp_path, global_step=2)
    raises("NOT_FOUND", "ckpt-0000000007 for shard 0 of 2", "there: ckpt-0000000001, ckpt-0000000002")(
        lambda: read_shard_checkpoint(tmp_path, "ckpt-0000000007", 0, 2)
    )
    # Shard 1 of 2 never saved step 1: same words, from its point of view.
    raises("NOT_FOUND", "ckpt-0000000001 for shard 1 of 2", "complete checkpoints there: none")(
        lambda: read_shard_checkpoint(tmp_path, "ckpt-0000000001", 1, 2)
    )
    (tmp_path / "ckpt-0000000002" / "shard-0-of-2.json").unlink()
    raises("NOT_FOUND", "but no manifest shard-0-of-2.json", "never finished", "there: ckpt-0000000001")(
        lambda: read_shard_checkpoint(tmp_path, "ckpt-0000000002", 0, 2)
    )


def flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))


def test_damaged_files_are_named(tmp_path: Path) -> None:
    info = save(tmp_path)
    read = lambda: read_shard_checkpoint(tmp_path, info.name, 0, 2)
    original, manifest_text = info.data_file.read_bytes(), info.manifest_file.read_text()

    flip_last_byte(info.data_file)  # same size: listing still trusts it, reading must not
    assert names(tmp_path) == [info.name]
    raises("FAILED_PRECONDITION", f"checkpoint {info.name}", "is damaged", str(info.data_file), "sha256")(read)

    info.data_file.write_bytes(original[:-8])
    raises("FAILED_PRECONDITION", "is damaged", str(info.data_file), f"{len(original) - 8} bytes", "manifest says")(
        read
    )

    info.data_file.unlink()
    raises("FAILED_PRECONDITION", "is damaged", str(info.data_file), "missing")(read)

    info.data_file.write_bytes(original)
    info.manifest_file.write_text("{not json")
    raises("FAILED_PRECONDITION", "is damaged", str(info.manifest_file), "not JSON")(read)

    info.manifest_file.write_bytes(b'{"format": "\xff"}')
    raises("FAILED_PRECONDITION", "is damaged", str(info.manifest_file), "not JSON")(read)

    manifest = json.loads(manifest_text)
    info.manifest_file.write_text(json.dumps({**manifest, "format_version": 2}))
    raises("FAILED_PRECONDITION", str(info.manifest_file), "has format version 2", "reads version 1")(read)
    assert names(tmp_path) == []

    info.manifest_file.write_text(json.dumps({**manifest, "optimizer": {"kind": "lamb"}}))
    raises("FAILED_PRECONDITION", "is damaged", str(info.manifest_file), "do not parse", "lamb")(read)

    odd = [{**manifest["specs"][0], "moving": True, "moving_momentum": 1.5}, *manifest["specs"][1:]]
    info.manifest_file.write_text(json.dumps({**manifest, "specs": odd}))
    raises(
        "FAILED_PRECONDITION", "is damaged", "do not parse", "variable 'w': moving_momentum must be in [0, 1], got 1.5"
    )(read)

    # A spec the data file holds no tensor of read as a KeyError later, in whoever used the checkpoint.
    extra = [*manifest["specs"], {**manifest["specs"][0], "name": "ghost"}]
    info.manifest_file.write_text(json.dumps({**manifest, "specs": extra}))
    raises("FAILED_PRECONDITION", "is damaged", str(info.manifest_file), "variable 'ghost' has a spec but no tensor")(
        read
    )
    shape = [{**manifest["specs"][0], "shape": [99]}, *manifest["specs"][1:]]
    info.manifest_file.write_text(json.dumps({**manifest, "specs": shape}))
    raises("FAILED_PRECONDITION", "is damaged", "does not agree with its tensors", "but its spec says float32(99")(read)

    info.manifest_file.write_text('{"format": "something-else"}')
    raises("FAILED_PRECONDITION", "is damaged", str(info.manifest_file), "not a cellgraph-ps-checkpoint manifest")(read)


def test_data_that_safetensors_cannot_parse_is_damaged(tmp_path: Path) -> None:
    # A manifest that vouches for garbage (size and sha256 match): the parse is the last line of defence.
    info = save(tmp_path)
    garbage = b"\xff" * 64
    info.data_file.write_bytes(garbage)
    manifest = json.loads(info.manifest_file.read_text())
    manifest["file"].update(size=len(garbage), sha256=hashlib.sha256(garbage).hexdigest())
    info.manifest_file.write_text(json.dumps(manifest))
    raises("FAILED_PRECONDITION", "is damaged", str(info.data_file), "safetensors cannot parse it")(
        lambda: read_shard_checkpoint(tmp_path, info.name, 0, 2)
    )


W = np.zeros((2, 3), np.float32)
W_SPEC = VariableSpec("w", W.dtype, W.shape)


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"keep": 0}, ["keep must be at least 1", "got 0"]),
        ({"job_id": ""}, ["job_id must be a non-empty string, got ''"]),
        ({"shard": 2, "num_shards": 2}, ["shard 2 of 2 is not a shard"]),
        ({"num_shards": 0}, ["shard 0 of 0 is not a shard"]),
        ({"global_step": -1}, ["global_step must be in [0, 9999999999]", "got -1"]),
        ({"global_step": 10**10}, ["global_step must be in", "got 10000000000"]),
        ({"tensors": {"w": W.astype(np.complex128)}}, ["tensor 'w' has dtype complex128", "supported: bool"]),
        ({"tensors": {"w": W, "__metadata__": W}}, ["'__metadata__' cannot be saved", "header's own key"]),
        ({"tensors": {"w/m": W}}, ["variable 'w' has a spec but no tensor to save; tensors: w/m"]),
        ({"tensors": {"w": W.T}}, ["variable 'w': its tensor is float32(3, 2) but its spec says float32(2, 3)"]),
        ({"tensors": {"w": W.astype(np.float64)}}, ["its tensor is float64(2, 3) but its spec says float32(2, 3)"]),
        ({"specs": [W_SPEC, W_SPEC]}, ["variable 'w' has two specs"]),
        ({"versions": {"v": 1}}, ["a version is given for 'v', which is not a variable of this shard; variables: w"]),
        ({"versions": {"w": -1}}, ["variable 'w' has version -1", "0 or more"]),
        ({"versions": {"w": 1.5}}, ["variable 'w' has version 1.5"]),
    ],
)
def test_bad_writes_are_refused_before_touching_disk(
    tmp_path: Path, overrides: dict[str, Any], words: list[str]
) -> None:
    args = {**shard_state(), "tensors": {"w": W}, "versions": {"w": 1}, "specs": [W_SPEC], **overrides}
    raises("INVALID_ARGUMENT", *words)(lambda: write_shard_checkpoint(tmp_path / "ckpts", **args))
    assert not (tmp_path / "ckpts").exists()


def test_a_directory_that_is_a_file(tmp_path: Path) -> None:
    blocker = tmp_path / "ckpts"
    blocker.write_text("in the way")
    raises("FAILED_PRECONDITION", "cannot write checkpoint ckpt-0000000120 for shard 0 of 2", str(blocker))(
        lambda: save(blocker)
    )
    raises("FAILED_PRECONDITION", f"checkpoint directory {blocker} is not a directory")(
        lambda: list_checkpoints(blocker, 0, 2)
    )


def test_a_write_the_file_system_refuses_is_an_error_naming_it_and_keeps_the_last_checkpoint(tmp_path: Path) -> None:
    import resource

    save(tmp_path, **one_variable(1.0, step=10, num_shards=2))
    big = one_variable(2.0, step=20, num_shards=2)
    big["tensors"] = {"w": np.ones(1 << 16, np.float32)}  # 256 KiB: past the limit below
    big["specs"] = [VariableSpec("w", np.dtype(np.float32), (1 << 16,))]
    # A real I/O error without root (a full disk needs a small file system): files of this process may not grow past
    # 64 KiB (Python ignores SIGXFSZ, so the write fails with EFBIG). safetensors raised it as its own
    # SafetensorError, not an OSError, and it escaped as an unknown error.
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, hard))
    try:
        with pytest.raises(ParameterServerError) as caught:
            save(tmp_path, **big)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert caught.value.code == "FAILED_PRECONDITION", str(caught.value)
    assert f"cannot write checkpoint ckpt-0000000020 for shard 0 of 2 in {tmp_path}: [Errno 27] File too large" in str(
        caught.value
    )
    assert names(tmp_path) == ["ckpt-0000000010"]  # the last one still loads; nothing of the failed one is listed
    assert read_shard_checkpoint(tmp_path, "ckpt-0000000010", 0, 2).global_step == 10


def test_shards_are_checked_on_read_and_list(tmp_path: Path) -> None:
    raises("INVALID_ARGUMENT", "shard -1 of 2 is not a shard")(lambda: list_checkpoints(tmp_path, -1, 2))
    raises("INVALID_ARGUMENT", "shard 3 of 3 is not a shard")(
        lambda: read_shard_checkpoint(tmp_path, "ckpt-0000000001", 3, 3)
    )


# ---------------------------------------------------------------------- crash safety
CRASH_WRITER = """
import sys

import numpy as np

from cellgraph.cluster.ps.checkpoint import write_shard_checkpoint
from cellgraph.cluster.ps.config import OptimizerConfig, TrainingConfig, VariableSpec


def save(step, w):
    write_shard_checkpoint(
        sys.argv[1], job_id="crash", shard=0, num_shards=1, global_step=step,
        tensors={"w": w}, versions={"w": step}, specs=[VariableSpec("w", w.dtype, w.shape)],
        optimizer=OptimizerConfig(), training=TrainingConfig(),
    )


save(1, np.arange(12, dtype=np.float32).reshape(3, 4) / 7)
print("saved step 1", flush=True)
save(2, np.ones(int(sys.argv[2]), np.float32))  # the test kills us while this is written
print("saved step 2", flush=True)
"""
BIG_FLOATS = 60_000_000  # 240 MB of float32: long enough to write that the kill lands mid-write


def wait_for(find: Callable[[], T | None], proc: subprocess.Popen[bytes], what: str) -> T:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        try:
            found = find()
        except FileNotFoundError:  # renamed or removed between listing and stat
            found = None
        if found is not None:
            return found
        if proc.poll() is not None:
            _, err = proc.communicate()
            pytest.fail(f"the writer exited ({proc.returncode}) before {what}:\n{err.decode()}")
        time.sleep(0.001)
    pytest.fail(f"no {what} within {DEADLINE_S} s")


@pytest.mark.slow
def test_sigkill_mid_write_leaves_the_previous_checkpoint(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", CRASH_WRITER, str(tmp_path), str(BIG_FLOATS)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    step2 = tmp_path / "ckpt-0000000002"

    def file_being_written() -> Path | None:
        staged = step2.glob(".shard-0-of-1.safetensors.*.tmp/*") if step2.exists() else iter(())
        return next((p for p in staged if p.stat().st_size > 0), None)

    try:
        # The data goes into a staging folder, where safetensors writes its own
        # temporary file (sized up front, then filled for most of a second): a file
        # with bytes there means the kill lands mid-write, well before the commit.
        wait_for(file_being_written, proc, "file with bytes in step 2's staging folder")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=DEADLINE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=DEADLINE_S)
    assert proc.returncode == -signal.SIGKILL
    assert not (step2 / "shard-0-of-1.json").exists(), "the kill came after step 2's commit: make BIG_FLOATS larger"
    assert any(step2.iterdir()), "the killed write left nothing behind to clean up"

    latest = latest_checkpoint(tmp_path, 0, 1)
    assert latest is not None and latest.name == "ckpt-0000000001"
    ckpt = read_shard_checkpoint(tmp_path, latest.name, 0, 1)
    assert_bit_exact(ckpt.tensors, {"w": np.arange(12, dtype=np.float32).reshape(3, 4) / 7})
    assert ckpt.versions == {"w": 1}

    save(tmp_path, **one_variable(3.0, step=3))
    assert names(tmp_path, 0, 1) == ["ckpt-0000000001", "ckpt-0000000003"]
    assert not step2.exists(), list(step2.iterdir())  # the leftovers went, and the folder with them
