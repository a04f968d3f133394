"""The JSON manifest of a shard's checkpoint: what it records, how it is written, and how it is trusted.

The manifest holds what safetensors cannot: the job, the shard, the step, the
versions, the variables' specs, the optimizer and training configs, and the
data file's size and sha256. Written last, it is the checkpoint's commit point
(``checkpoint.py`` writes and reads the files; this module knows their JSON).

Examples
--------
>>> import numpy as np
>>> from cellgraph.cluster.ps.config import VariableSpec
>>> spec = VariableSpec("w", np.dtype("float32"), (2, 3))
>>> spec_to_json(spec)
{'name': 'w', 'dtype': 'float32', 'shape': [2, 3], 'full_shape': None, 'rows': None, 'moving': False, 'moving_momentum': 0.0}
>>> spec_from_json(spec_to_json(spec)) == spec
True
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import stat
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ParameterServerError
from .config import OptimizerConfig, TrainingConfig, VariableSpec, check_moving_momentum

if TYPE_CHECKING:  # checkpoint.py imports this module: the info's class is for the type checker only
    from .checkpoint import CheckpointInfo

FORMAT = "cellgraph-ps-checkpoint"
FORMAT_VERSION = 1


def build_manifest(
    info: CheckpointInfo,
    *,
    job_id: str,
    arrays: Mapping[str, np.ndarray],
    versions: Mapping[str, int],
    specs: Sequence[VariableSpec],
    optimizer: OptimizerConfig,
    training: TrainingConfig,
    size: int,
    sha256: str,
) -> dict[str, Any]:
    """The manifest of checkpoint ``info`` whose data file, already written, holds ``arrays``."""
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "job_id": job_id,
        "shard": info.shard,
        "num_shards": info.num_shards,
        "global_step": info.step,
        "versions": {name: int(version) for name, version in versions.items()},
        "tensors": {name: {"dtype": a.dtype.name, "shape": list(a.shape)} for name, a in arrays.items()},
        "specs": [spec_to_json(spec) for spec in specs],
        "optimizer": dataclasses.asdict(optimizer),
        "training": dataclasses.asdict(training),
        "file": {"name": info.data_file.name, "size": size, "sha256": sha256},
        "written_at": datetime.now(UTC).isoformat(timespec="milliseconds"),
    }


def dump_manifest(manifest: Mapping[str, Any], path: Path) -> None:
    """Write ``manifest`` as indented JSON to ``path`` (the caller fsyncs and renames it)."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")
        f.flush()


_KINDS = {
    stat.S_IFDIR: "a folder", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
    stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket",
}  # fmt: skip


def read_regular_file(path: Path) -> bytes:
    """The bytes of ``path`` when it is a regular file (a link to one is followed), else an ``OSError`` saying what it is.

    A checkpoint or saved-model folder is data from whoever wrote it: a file there that linked to
    /dev/zero was read until memory ran out, and a FIFO blocked its reader for good. Opened without
    blocking, it is looked at (fstat) before one byte is read.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = _KINDS.get(stat.S_IFMT(mode), "not a file")
            link = f" (a link to {os.path.realpath(path)!r})" if os.path.islink(path) else ""
            raise OSError(errno.EINVAL, f"it is {kind}{link}, not a regular file")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read()
    finally:
        os.close(fd)


def read_manifest(info: CheckpointInfo) -> dict[str, Any]:
    """The manifest, checked far enough to trust its file record and that it belongs where it lies."""
    path = info.manifest_file
    try:
        raw = read_regular_file(path)
    except FileNotFoundError:
        raise  # the caller decides: skipped by listing, NOT_FOUND when asked for by name
    except OSError as exc:
        raise ParameterServerError(
            f"checkpoint {info.name}: cannot read manifest {path}: {exc.strerror or exc}", "FAILED_PRECONDITION"
        ) from exc
    try:
        manifest = json.loads(raw)  # bytes: bad UTF-8 is damage too, caught here
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise damaged(info, path, f"it is not JSON ({exc})") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise damaged(info, path, f"it is not a {FORMAT} manifest")
    if manifest.get("format_version") != FORMAT_VERSION:
        # Not damage: a newer writer. Still unloadable here, so not a checkpoint for listing either.
        raise ParameterServerError(
            f"checkpoint {info.name}: manifest {path} has format version {manifest.get('format_version')!r}; "
            f"this cellgraph reads version {FORMAT_VERSION}",
            "FAILED_PRECONDITION",
        )
    for key, want in (("shard", info.shard), ("num_shards", info.num_shards), ("global_step", info.step)):
        if manifest.get(key) != want:
            raise damaged(info, path, f"its {key} is {manifest.get(key)!r}, where its name and place say {want}")
    record = manifest.get("file")
    if (
        not isinstance(record, dict)
        or not isinstance(record.get("size"), int)
        or not isinstance(record.get("sha256"), str)
    ):
        raise damaged(info, path, f"its file record {record!r} lacks an integer size and a sha256")
    return manifest


def spec_to_json(spec: VariableSpec) -> dict[str, Any]:
    return {
        "name": spec.name,
        "dtype": np.dtype(spec.dtype).name,
        "shape": list(spec.shape),
        "full_shape": None if spec.full_shape is None else list(spec.full_shape),
        "rows": None if spec.rows is None else list(spec.rows),
        "moving": spec.moving,
        "moving_momentum": spec.momentum,
    }


def spec_from_json(raw: dict[str, Any]) -> VariableSpec:
    full_shape, rows = raw["full_shape"], raw["rows"]
    momentum = float(raw.get("moving_momentum", 0.0))
    check_moving_momentum(str(raw["name"]), momentum)  # read_checkpoint reports the manifest as damaged
    return VariableSpec(
        name=str(raw["name"]),
        dtype=np.dtype(raw["dtype"]),
        shape=tuple(int(d) for d in raw["shape"]),
        full_shape=None if full_shape is None else tuple(int(d) for d in full_shape),
        rows=None if rows is None else (int(rows[0]), int(rows[1])),
        moving=bool(raw.get("moving", False)),  # absent from manifests written before moving statistics
        momentum=momentum,
    )


def damaged(info: CheckpointInfo, path: Path, why: str) -> ParameterServerError:
    """The error for a file of checkpoint ``info`` (its manifest or its data) that cannot be trusted."""
    # DATA_LOSS would be the exact status, but the service answers with STATUS_CODES only.
    return ParameterServerError(
        f"checkpoint {info.name} for shard {info.shard} of {info.num_shards} is damaged: file {path}: {why}",
        "FAILED_PRECONDITION",
    )
