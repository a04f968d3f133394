"""Numba caches for kernels that call helpers in other files: one folder per version of the sources.

Numba keys a kernel's cached machine code by its own file alone (its path, size
and time). A kernel that inlines a helper from another file (``scalar.py``,
``vector_f32.py``) kept the old helper's code after the helper changed, until
its own file changed too: a branch switch or an edit of one helper gave wrong
numbers without a word. So ``kernels/cpu`` decorates its kernels inside
``numba_cache_for(folder)``: their caches go to a folder named by a digest of
every source file in ``folder``, and a change to any of them starts a fresh
cache. The folder is under ``NUMBA_CACHE_DIR`` when that is set, else under
cellgraph's cache (``CELLGRAPH_CACHE_DIR``, by default ``~/.cache/cellgraph``);
where neither can be written, Numba's own choice stands.

Examples
--------
>>> import tempfile
>>> one, two = Path(tempfile.mkdtemp()), Path(tempfile.mkdtemp())
>>> _ = (one / "helper.py").write_text("ONE = 1"), (two / "helper.py").write_text("ONE = 2")
>>> sources_digest(one) == sources_digest(two)
False
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator
from functools import cache
from pathlib import Path

from numba import config

from .compile_once import cache_dir


@cache
def sources_digest(folder: Path) -> str:
    """A digest of every ``.py`` file under ``folder`` (names and contents); 16 hex digits. Read once a process:
    the sources a process runs do not change under it."""
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*.py")):
        digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


@cache
def cache_folder(folder: Path) -> Path | None:
    """Where the kernels of ``folder`` are cached: a subfolder named by their sources' digest; None if unwritable.
    Found once a process: every kernel of ``folder`` is decorated at import, and each asks."""
    return cache_dir(f"kernels-{folder.name}-{sources_digest(folder)}", root=os.environ.get("NUMBA_CACHE_DIR"))


@contextlib.contextmanager
def numba_cache_for(folder: Path) -> Iterator[Path | None]:
    """Inside, a function decorated ``@njit(cache=True)`` caches in ``cache_folder(folder)``; the folder (or None)."""
    target = cache_folder(folder)
    if target is None:
        yield None
        return
    before = getattr(config, "CACHE_DIR", "")
    config.CACHE_DIR = str(target)  # type: ignore[attr-defined]  # read when a dispatcher makes its cache
    try:
        yield target
    finally:
        config.CACHE_DIR = before  # type: ignore[attr-defined]
