"""A parameter-server shard's checkpoints: safetensors files that a crash cannot tear.

Each shard of a job saves its own part of the state, one folder per step::

    {directory}/ckpt-0000000120/shard-0-of-2.safetensors   # values and optimizer slots
    {directory}/ckpt-0000000120/shard-0-of-2.json          # the manifest

The data is plain safetensors, so any tool that reads the format reads it (the
job id and step are in its header's metadata too). The manifest holds what
safetensors cannot: versions, the variables' specs, the optimizer and training
configs, and the data file's size and sha256 (its JSON: ``checkpoint_manifest.py``).

Crash safety rests on one rule: **the manifest is the commit point**. Each file
is written in a hidden staging folder beside it, fsynced, renamed over its
final name and its folder fsynced; data first, manifest last. A checkpoint counts only when
its manifest parses and the data file has the size it records (reading also
checks the sha256). A process killed at any moment therefore leaves the
previous checkpoint loadable; the staging folders it leaves are skipped by
listing and removed by that shard's next successful write.

One process writes a shard (a lock serializes its threads); many shards may
share one directory, each touching only its own files (staging folders are
named ``.shard-{i}-of-{n}.<file>.<random>.tmp`` for that reason).

Examples
--------
>>> import tempfile
>>> import numpy as np
>>> from cellgraph.cluster.ps.config import OptimizerConfig, TrainingConfig, VariableSpec
>>> w = np.arange(6, dtype=np.float32).reshape(2, 3)
>>> with tempfile.TemporaryDirectory() as d:
...     info = write_shard_checkpoint(
...         d, job_id="demo", shard=0, num_shards=1, global_step=120,
...         tensors={"w": w}, versions={"w": 7}, specs=[VariableSpec("w", w.dtype, w.shape)],
...         optimizer=OptimizerConfig(), training=TrainingConfig(),
...     )
...     ckpt = read_shard_checkpoint(d, latest_checkpoint(d, 0, 1).name, 0, 1)
>>> info.name, ckpt.global_step, ckpt.versions
('ckpt-0000000120', 120, {'w': 7})
>>> bool((ckpt.tensors["w"] == w).all())
True
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import secrets
import shutil
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import safetensors.numpy

from cellgraph.dataflow.shapes import fmt

from ..errors import ParameterServerError
from .checkpoint_manifest import (
    build_manifest,
    damaged,
    dump_manifest,
    read_manifest,
    read_regular_file,
    spec_from_json,
)
from .config import OptimizerConfig, TrainingConfig, VariableSpec

__all__ = [
    "CheckpointInfo",
    "ShardCheckpoint",
    "latest_checkpoint",
    "list_checkpoints",
    "read_shard_checkpoint",
    "write_shard_checkpoint",
]

# [0-9], not \d: \d also matches other scripts' digits, and the name comes off the wire.
_NAME = re.compile(r"ckpt-([0-9]{10})")
_OS_ERROR = re.compile(r"\(os error ([0-9]+)\)")  # how safetensors (Rust's io::Error) gives an errno
_MAX_STEP = 10**10 - 1  # the most that ckpt-{step:010d} holds in its ten digits

# The dtypes safetensors.numpy can both write and read back (bfloat16 and the
# float8 types have no NumPy dtype; complex128 has no safetensors one).
_DTYPES = tuple("bool int8 uint8 int16 uint16 int32 uint32 int64 uint64 float16 float32 float64 complex64".split())


@dataclass(frozen=True)
class CheckpointInfo:
    """One shard's complete checkpoint, found under ``directory`` (the root, not the ``ckpt-`` folder)."""

    name: str
    step: int
    shard: int
    num_shards: int
    directory: Path

    @property
    def path(self) -> Path:
        """The checkpoint's folder, shared by all the shards' files of this step."""
        return self.directory / self.name

    @property
    def data_file(self) -> Path:
        return self.path / f"{_stem(self.shard, self.num_shards)}.safetensors"

    @property
    def manifest_file(self) -> Path:
        return self.path / f"{_stem(self.shard, self.num_shards)}.json"


@dataclass(frozen=True)
class ShardCheckpoint:
    """What one shard saved: its tensors (values and slots, writable arrays) and the job around them."""

    info: CheckpointInfo
    job_id: str
    global_step: int
    versions: dict[str, int]
    tensors: dict[str, np.ndarray]
    specs: list[VariableSpec]
    optimizer: OptimizerConfig
    training: TrainingConfig


# ---------------------------------------------------------------------- writing
def write_shard_checkpoint(
    directory: str | Path,
    *,
    job_id: str,
    shard: int,
    num_shards: int,
    global_step: int,
    tensors: Mapping[str, np.ndarray],
    versions: Mapping[str, int],
    specs: Sequence[VariableSpec],
    optimizer: OptimizerConfig,
    training: TrainingConfig,
    keep: int = 5,
) -> CheckpointInfo:
    """Save one shard's state as checkpoint ``ckpt-{global_step:010d}``, then prune old ones.

    Parameters
    ----------
    directory
        The checkpoints' root, created if missing; shards of one job share it.
    job_id, shard, num_shards, global_step
        Who saves and at which step; the step names the checkpoint.
    tensors
        Every array to save: variables' values under their names, optimizer
        slots under ``"{name}/{slot}"``. Each spec's tensor must match its dtype and shape.
    versions
        Per-variable versions (keys must be variables in ``specs``).
    specs, optimizer, training
        The job's configuration, kept in the manifest so a restore can check it fits.
    keep
        After the commit, this shard keeps its newest ``keep`` complete
        checkpoints, always counting the one just written, and deletes its files
        of the older ones (and a checkpoint's folder once no shard has files there).

    Returns
    -------
    CheckpointInfo
        The checkpoint just committed.

    Raises
    ------
    ParameterServerError
        ``INVALID_ARGUMENT`` for bad arguments (naming the tensor or variable);
        ``RESOURCE_EXHAUSTED`` when the disk is full; ``FAILED_PRECONDITION``
        when the directory cannot be written.

    Notes
    -----
    Writing a step that already exists replaces it: its old manifest is removed
    first, so a crash during the rewrite leaves that step absent for this shard
    (older checkpoints still load), never a manifest paired with the wrong data.
    """
    _check_shard(shard, num_shards)
    if not isinstance(job_id, str) or not job_id:
        raise _invalid(f"job_id must be a non-empty string, got {job_id!r}")
    if keep < 1:
        raise _invalid(f"keep must be at least 1 (the checkpoint just written), got {keep}")
    if not 0 <= global_step <= _MAX_STEP:
        raise _invalid(f"global_step must be in [0, {_MAX_STEP}] to name a checkpoint, got {global_step}")
    arrays = _check_tensors(tensors, versions, specs)
    root = Path(directory)
    info = CheckpointInfo(f"ckpt-{global_step:010d}", global_step, shard, num_shards, root)
    with _shard_lock(root, shard, num_shards):
        try:
            _commit(info, arrays, job_id, versions, specs, optimizer, training)
        except OSError as exc:
            code = "RESOURCE_EXHAUSTED" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else "FAILED_PRECONDITION"
            raise ParameterServerError(
                f"cannot write checkpoint {info.name} for shard {shard} of {num_shards} in {root}: {exc}", code
            ) from exc
        try:
            _tidy(info, keep)
        except OSError as exc:
            # The checkpoint is committed and loadable: the message says so, lest a caller redo a save that worked.
            raise ParameterServerError(
                f"checkpoint {info.name} for shard {shard} of {num_shards} was written in {root}, "
                f"but removing this shard's older files failed: {exc}",
                "FAILED_PRECONDITION",
            ) from exc
    return info


def _commit(
    info: CheckpointInfo,
    arrays: dict[str, np.ndarray],
    job_id: str,
    versions: Mapping[str, int],
    specs: Sequence[VariableSpec],
    optimizer: OptimizerConfig,
    training: TrainingConfig,
) -> None:
    info.path.mkdir(parents=True, exist_ok=True)
    # The new folder's entry in the root must reach the disk too, or a power cut loses the whole checkpoint.
    _fsync_dir(info.directory)
    if info.manifest_file.exists():
        # Rewriting a step: uncommit the old pair before its data file is replaced, so
        # that no crash can leave the old manifest vouching for the new data.
        info.manifest_file.unlink()
        _fsync_dir(info.path)
    metadata = {
        "job_id": job_id,
        "global_step": str(info.step),
        "shard": str(info.shard),
        "num_shards": str(info.num_shards),
    }
    size, sha256 = _write_atomically(info.data_file, lambda tmp: _save_safetensors(arrays, tmp, metadata))
    manifest = build_manifest(
        info,
        job_id=job_id,
        arrays=arrays,
        versions=versions,
        specs=specs,
        optimizer=optimizer,
        training=training,
        size=size,
        sha256=sha256,
    )
    _write_atomically(info.manifest_file, lambda tmp: dump_manifest(manifest, tmp))  # the commit


def _save_safetensors(arrays: dict[str, np.ndarray], path: Path, metadata: dict[str, str]) -> None:
    """``safetensors.numpy.save_file``, its I/O errors raised as ``OSError`` with their errno.

    safetensors raises them as its own ``SafetensorError`` ("I/O error: No space left on device (os error
    28)"), which is no ``OSError``: a full disk then escaped as an unknown error, and killed the server's
    checkpoint thread.
    """
    try:
        safetensors.numpy.save_file(arrays, path, metadata=metadata)
    except safetensors.SafetensorError as exc:
        found = _OS_ERROR.search(str(exc))
        code = int(found[1]) if found else errno.EIO
        raise OSError(code, f"{os.strerror(code)} (safetensors: {exc})", str(path)) from exc


def _write_atomically(final: Path, write: Callable[[Path], None]) -> tuple[int, str]:
    """Have ``write`` fill a file in a private staging folder, then rename it onto ``final``.

    A crash leaves either the old ``final`` or the new one, never a torn one.
    Returns the file's size and sha256. The staging folder, not just a
    temporary name, because ``safetensors.numpy.save_file`` itself writes
    through a temporary file of its own naming (``.tmpXXXXXX``) beside its
    target: inside our folder, whatever a killed write leaves is known to be
    this shard's and goes with the folder.
    """
    staging = _create_staging(final)
    tmp = staging / final.name
    try:
        write(tmp)
        # Opened by path: safetensors writes (and renames) on its own, and this
        # fsyncs whatever inode the name ends up holding.
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())  # the bytes are on disk before a rename can point at them
            size = os.fstat(f.fileno()).st_size
            sha256 = hashlib.file_digest(f, "sha256").hexdigest()
        os.replace(tmp, final)
    finally:
        _remove(staging)
    _fsync_dir(final.parent)  # and the rename itself survives a power cut
    return size, sha256


def _create_staging(final: Path) -> Path:
    """Make a fresh staging folder beside ``final``: hidden, and marked as this shard's by its prefix."""
    for attempt in range(3):
        staging = final.with_name(f".{final.name}.{secrets.token_hex(4)}.tmp")
        try:
            staging.mkdir()
            return staging
        except FileNotFoundError:
            # Another shard's pruning removed the checkpoint's folder while it
            # was empty, between our mkdir and now: make it again.
            if attempt == 2:
                raise
            final.parent.mkdir(parents=True, exist_ok=True)
    raise AssertionError("unreachable")  # pragma: no cover


def _remove(path: Path) -> None:
    """Delete a file or a folder tree; one already gone is fine (a concurrent tidy got there first)."""
    with contextlib.suppress(FileNotFoundError):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def _tidy(info: CheckpointInfo, keep: int) -> None:
    """Remove this shard's leftovers and its complete checkpoints beyond ``keep``.

    Leftovers are staging folders and data files without a manifest (a write
    killed before its commit). Files whose manifest is damaged are left for
    a person to look at. Nothing here needs an fsync: a deletion lost to a
    power cut is simply redone by a later write.
    """
    stem = _stem(info.shard, info.num_shards)
    touched: set[Path] = set()
    for folder in _checkpoint_folders(info.directory):
        try:
            leftovers = [p for p in folder.iterdir() if p.name.startswith(f".{stem}.") and p.name.endswith(".tmp")]
        except FileNotFoundError:  # another shard removed the folder just now
            continue
        data, manifest = folder / f"{stem}.safetensors", folder / f"{stem}.json"
        if data.exists() and not manifest.exists():
            leftovers.append(data)
        for path in leftovers:
            _remove(path)
            touched.add(folder)
    older = [c for c in list_checkpoints(info.directory, info.shard, info.num_shards) if c.name != info.name]
    for old in older[: max(0, len(older) - (keep - 1))]:
        # Manifest first: a crash between the two deletions leaves a leftover, not a broken checkpoint.
        for path in (old.manifest_file, old.data_file):
            _remove(path)
        touched.add(old.path)
    for folder in touched - {info.path}:
        # Fails while other shards still have files there; the last one out removes the folder.
        with contextlib.suppress(OSError):
            folder.rmdir()


def _check_tensors(
    tensors: Mapping[str, np.ndarray], versions: Mapping[str, int], specs: Sequence[VariableSpec]
) -> dict[str, np.ndarray]:
    """The tensors as C-contiguous arrays, after checking they can be saved and agree with the specs."""
    arrays: dict[str, np.ndarray] = {}
    for name, value in tensors.items():
        if not isinstance(name, str) or not name or name == "__metadata__":
            raise _invalid(
                f"tensor name {name!r} cannot be saved: names are non-empty strings, "
                "and '__metadata__' is the safetensors header's own key"
            )
        array = np.asarray(value)
        if array.dtype.name not in _DTYPES:
            raise _invalid(
                f"tensor {name!r} has dtype {array.dtype}, which a safetensors checkpoint cannot hold; "
                f"supported: {', '.join(_DTYPES)}"
            )
        # safetensors.numpy copies nbytes from the array's data pointer: a strided view would be saved scrambled.
        arrays[name] = array if array.flags.c_contiguous else np.ascontiguousarray(array)
    variables: set[str] = set()
    for spec in specs:
        if spec.name in variables:
            raise _invalid(f"variable {spec.name!r} has two specs")
        variables.add(spec.name)
        if spec.name not in arrays:
            raise _invalid(
                f"variable {spec.name!r} has a spec but no tensor to save; tensors: {', '.join(arrays) or 'none'}"
            )
        array, dtype = arrays[spec.name], np.dtype(spec.dtype)
        if array.dtype != dtype or array.shape != tuple(spec.shape):
            raise _invalid(
                f"variable {spec.name!r}: its tensor is {array.dtype}{fmt(array.shape)} "
                f"but its spec says {dtype}{fmt(spec.shape)}"
            )
    for name, version in versions.items():
        if name not in variables:
            raise _invalid(
                f"a version is given for {name!r}, which is not a variable of this shard; "
                f"variables: {', '.join(sorted(variables)) or 'none'}"
            )
        if isinstance(version, bool) or not isinstance(version, int | np.integer) or version < 0:
            raise _invalid(f"variable {name!r} has version {version!r}; versions are integers, 0 or more")
    return arrays


# ---------------------------------------------------------------------- finding
def list_checkpoints(directory: str | Path, shard: int, num_shards: int) -> list[CheckpointInfo]:
    """This shard's complete checkpoints under ``directory``, oldest first; ``[]`` if it does not exist.

    Complete means committed: the manifest parses and the data file has the
    size it records. Unfinished writes (staging folders, data without a
    manifest) and damaged files are skipped; ``read_shard_checkpoint`` says
    what is wrong with a damaged one.
    """
    _check_shard(shard, num_shards)
    root = Path(directory)
    found = []
    for folder in _checkpoint_folders(root):
        info = CheckpointInfo(folder.name, _step_of(folder.name), shard, num_shards, root)
        try:
            manifest = read_manifest(info)
            complete = info.data_file.stat().st_size == manifest["file"]["size"]
        except (ParameterServerError, OSError):
            complete = False
        if complete:
            found.append(info)
    return sorted(found, key=lambda info: info.step)


def latest_checkpoint(directory: str | Path, shard: int, num_shards: int) -> CheckpointInfo | None:
    """This shard's newest complete checkpoint under ``directory``, or None when it has none."""
    found = list_checkpoints(directory, shard, num_shards)
    return found[-1] if found else None


def _checkpoint_folders(root: Path) -> list[Path]:
    if not root.exists():
        return []
    if not root.is_dir():
        raise ParameterServerError(f"checkpoint directory {root} is not a directory", "FAILED_PRECONDITION")
    return [p for p in root.iterdir() if _NAME.fullmatch(p.name) and p.is_dir()]


# ---------------------------------------------------------------------- reading
def read_shard_checkpoint(directory: str | Path, name: str, shard: int, num_shards: int) -> ShardCheckpoint:
    """Load this shard's part of checkpoint ``name``, checking the data against the manifest's sha256.

    Parameters
    ----------
    directory
        The checkpoints' root.
    name
        A checkpoint name such as ``"ckpt-0000000120"``, never a path (it may come off the wire).
    shard, num_shards
        Which shard's files to read.

    Raises
    ------
    ParameterServerError
        ``INVALID_ARGUMENT`` for a name that is not a checkpoint name;
        ``NOT_FOUND`` when this shard has no committed checkpoint of that name
        (the message lists the ones it has); ``FAILED_PRECONDITION`` when a file
        is damaged (wrong size or sha256, unparsable), naming the file.
    """
    _check_shard(shard, num_shards)
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise _invalid(
            f"{name!r} is not a checkpoint name: expected 'ckpt-' and ten digits, like 'ckpt-0000000120' "
            "(a name from Save or list_checkpoints, not a path)"
        )
    root = Path(directory)
    info = CheckpointInfo(name, _step_of(name), shard, num_shards, root)
    try:
        manifest = read_manifest(info)
    except FileNotFoundError:
        raise _not_found(info) from None
    data_file = info.data_file
    try:
        data = read_regular_file(data_file)
    except FileNotFoundError:
        raise damaged(info, data_file, "it is missing, though the manifest names it") from None
    except OSError as exc:
        raise damaged(info, data_file, f"it cannot be read: {exc.strerror or exc}") from None
    if len(data) != manifest["file"]["size"]:
        raise damaged(info, data_file, f"it is {len(data)} bytes, the manifest says {manifest['file']['size']}")
    sha256 = hashlib.sha256(data).hexdigest()
    if sha256 != manifest["file"]["sha256"]:
        raise damaged(info, data_file, f"its sha256 is {sha256}, the manifest says {manifest['file']['sha256']}")
    try:
        loaded = safetensors.numpy.load(data)
    except Exception as exc:  # safetensors raises its own SafetensorError, and others for odd headers
        raise damaged(info, data_file, f"safetensors cannot parse it ({exc})") from exc
    del data
    try:
        expected = {k: (np.dtype(v["dtype"]), tuple(v["shape"])) for k, v in manifest["tensors"].items()}
        specs = [spec_from_json(s) for s in manifest["specs"]]
        checkpoint = ShardCheckpoint(
            info=info,
            job_id=str(manifest["job_id"]),
            global_step=info.step,
            versions={str(k): int(v) for k, v in manifest["versions"].items()},
            # load() may hand out read-only views of its buffer; the store updates these in place.
            tensors={k: v if v.flags.writeable else v.copy() for k, v in loaded.items()},
            specs=specs,
            optimizer=OptimizerConfig.from_fields(manifest["optimizer"]),
            training=TrainingConfig(**manifest["training"]),
        )
    except (KeyError, TypeError, ValueError, AttributeError, ParameterServerError) as exc:
        raise damaged(info, info.manifest_file, f"its contents do not parse ({exc!r})") from exc
    actual = {k: (v.dtype, v.shape) for k, v in checkpoint.tensors.items()}
    if actual != expected:
        raise damaged(info, data_file, f"its tensors {_describe(actual)} are not the manifest's {_describe(expected)}")
    try:  # what a write checks, read back: a spec without its tensor, or of another shape, is no state to restore
        _check_tensors(checkpoint.tensors, checkpoint.versions, checkpoint.specs)
    except ParameterServerError as exc:
        raise damaged(info, info.manifest_file, f"it does not agree with its tensors: {exc}") from None
    return checkpoint


# ---------------------------------------------------------------------- helpers
def _stem(shard: int, num_shards: int) -> str:
    return f"shard-{shard}-of-{num_shards}"


def _step_of(name: str) -> int:
    match = _NAME.fullmatch(name)
    assert match is not None, name  # callers match first
    return int(match[1])


def _check_shard(shard: int, num_shards: int) -> None:
    if num_shards < 1 or not 0 <= shard < num_shards:
        raise _invalid(
            f"shard {shard} of {num_shards} is not a shard: need num_shards >= 1 and 0 <= shard < num_shards"
        )


def _fsync_dir(path: Path) -> None:
    """Make a folder's entries (new files, renames) durable: a file's fsync does not cover its name."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_LOCKS: dict[tuple[str, int, int], threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


def _shard_lock(root: Path, shard: int, num_shards: int) -> threading.Lock:
    """One lock per (directory, shard): two threads saving one shard would tidy away each other's staging folders."""
    key = (os.path.realpath(root), shard, num_shards)
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(key, threading.Lock())


def _describe(tensors: Mapping[str, tuple[np.dtype, tuple[int, ...]]]) -> str:
    return "{" + ", ".join(f"{k}: {dtype}{fmt(shape)}" for k, (dtype, shape) in sorted(tensors.items())) + "}"


def _invalid(message: str) -> ParameterServerError:
    return ParameterServerError(message, "INVALID_ARGUMENT")


def _not_found(info: CheckpointInfo) -> ParameterServerError:
    unfinished = ""
    if info.data_file.exists():
        unfinished = (
            f" (it has {info.data_file.name} but no manifest {info.manifest_file.name}: its write never finished)"
        )
    existing = [c.name for c in list_checkpoints(info.directory, info.shard, info.num_shards)]
    return ParameterServerError(
        f"checkpoint {info.name} for shard {info.shard} of {info.num_shards} not found in {info.directory}{unfinished}; "
        f"complete checkpoints there: {', '.join(existing) or 'none'}",
        "NOT_FOUND",
    )
