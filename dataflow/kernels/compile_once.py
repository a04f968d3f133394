"""One compile per machine: a Numba kernel is compiled by one process while the others wait and load its cache.

Every cellgraph kernel is cached on disk (``cache=True``), but Numba looks
at its cache only once, before it compiles: processes that start together
(a local cluster's workers, the notebook's kernel beside them) all miss the
empty cache and all compile the same kernels at once, on the same cores.
``compile_once`` wraps a dispatcher's ``compile`` in an exclusive file lock
next to Numba's own index file (``<cache dir>/<function>.nbi.lock``): the
first process compiles and writes the cache, the others wait for the lock
(at most ``COMPILE_WAIT_S``; past it each compiles on its own, as Numba
would) and then find the cache written.

Locks are taken inside Numba's global compiler lock, so that one thread per
process is ever between them, and nested only from a caller to a kernel it
calls (kernels do not call each other in a cycle): two processes can never
wait for each other. Every compile and cache load is counted, for progress
(``compiling kernels 12 ...``) and for the tests.

Examples
--------
>>> from numba import njit
>>> double = compile_once(njit(cache=False)(lambda x: 2 * x))  # no cache: nothing to share, no lock
>>> double(21)
42
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from numba.core import sigutils
from numba.core.compiler_lock import global_compiler_lock
from numba.core.registry import CPUDispatcher

# How long a process waits for another one's compile of the same kernel before compiling it itself.
COMPILE_WAIT_S = 600.0
POLL_S = 0.02  # how often a waiting process tries the lock again

How = Literal["compiled", "loaded"]


@dataclass(frozen=True)
class CompileEvent:
    """One kernel signature made ready in this process: ``compiled`` here, or ``loaded`` from the cache (``waited``:
    after another process held its lock)."""

    kernel: str
    how: How
    waited: bool


@dataclass
class CompileCounts:
    """What this process has done so far: kernel signatures compiled, loaded from the cache, and waited for."""

    compiled: int = 0
    loaded: int = 0
    waited: int = 0


counts = CompileCounts()
_listeners: list[Callable[[CompileEvent], None]] = []
_held: set[str] = set()  # lock files this process holds (under the compiler lock): a nested compile of the same one


def cache_dir(name: str, root: str | None = None) -> Path | None:
    """The writable folder ``name`` of cellgraph's cache (``CELLGRAPH_CACHE_DIR``, by default
    ``~/.cache/cellgraph``) or of ``root``, made if need be; ``None`` where it cannot be written."""
    root = root or os.environ.get("CELLGRAPH_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "cellgraph")
    path = Path(root) / name
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return path if os.access(path, os.W_OK) else None


def add_listener(listener: Callable[[CompileEvent], None]) -> Callable[[], None]:
    """Call ``listener`` (on the compiling thread, inside Numba's compiler lock: keep it short) after each kernel
    signature is compiled or loaded; returns a function that removes it."""
    _listeners.append(listener)
    return lambda: _listeners.remove(listener) if listener in _listeners else None


def compile_once(dispatcher: Any) -> Any:
    """``dispatcher`` (a Numba ``CPUDispatcher``) whose compiles take the machine-wide lock of its cache; returned."""
    if not _on_cpu(dispatcher):  # a CUDA kernel (or the simulator's): compiled where it runs
        return dispatcher
    cache = dispatcher._cache  # Numba's cache of this function; a NullCache (no path) when caching is off
    index = getattr(getattr(cache, "_cache_file", None), "_index_path", None)
    if index is None:
        return dispatcher
    lock_path = Path(f"{index}.lock")
    name = f"{dispatcher.py_func.__module__.rsplit('.', 1)[-1]}.{dispatcher.py_func.__name__}"
    numba_compile = dispatcher.compile

    def locked_compile(sig: Any) -> Any:
        with global_compiler_lock:
            if tuple(sigutils.normalize_signature(sig)[0]) in dispatcher.overloads:
                return numba_compile(sig)  # this process has it: no lock to wait for (a caller being typed asks)
            before = sum(dispatcher._cache_misses.values()), sum(dispatcher._cache_hits.values())
            with _locked(lock_path) as waited:
                entry = numba_compile(sig)
            after = sum(dispatcher._cache_misses.values()), sum(dispatcher._cache_hits.values())
            if after != before:  # counted under the lock: one thread at a time
                _note(CompileEvent(name, "compiled" if after[0] > before[0] else "loaded", waited))
        return entry

    dispatcher.compile = locked_compile
    return dispatcher


def _on_cpu(dispatcher: Any) -> bool:
    return isinstance(dispatcher, CPUDispatcher)


def _note(event: CompileEvent) -> None:
    if event.how == "compiled":
        counts.compiled += 1
    else:
        counts.loaded += 1
    counts.waited += event.waited
    for listener in list(_listeners):
        listener(event)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[bool]:
    """Hold the exclusive lock ``path`` (whether another process held it first); without it if the file cannot be
    made (a read-only cache, which Numba does not write either) or after ``COMPILE_WAIT_S``."""
    key = str(path)
    if key in _held:
        yield False
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield False
        return
    waited, locked = False, False
    deadline = time.monotonic() + COMPILE_WAIT_S
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                locked = True
                break
            except BlockingIOError:
                waited = True
                if time.monotonic() > deadline:
                    break  # the other process is stuck or gone without unlocking (a lock dies with its process)
                time.sleep(POLL_S)
        _held.add(key)
        try:
            yield waited
        finally:
            _held.discard(key)
    finally:
        if locked:
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


__all__ = ["COMPILE_WAIT_S", "CompileCounts", "CompileEvent", "add_listener", "cache_dir", "compile_once", "counts"]
