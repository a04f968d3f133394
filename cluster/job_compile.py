"""A job's kernels, compiled in this process while its cluster starts (issue 18, item 16), with their progress.

On a fresh machine most of a first job's start is Numba compiling the
replicas' kernels. Each kernel is compiled once per machine
(``dataflow.kernels.compile_once``: a process that needs a kernel another
one is compiling waits for it and loads the cache), so on a local cluster
this process can compile the step its replicas will run, beside them and
ahead of them, and say how far it got: ``job.compiling`` (``compiling
kernels 12 (conv.im2col)``, which ``cellgraph demo`` shows), an event every
``NOTE_EVERY_S`` while it lasts, and one when every kernel is ready. The
replicas load what it compiled, and it loads what they did. A remote
cluster's workers have caches of their own: nothing is compiled here then.

The step is the one the replicas run: their partition of the placed step
(``PlacedTraining.worker``), on one batch of the data, at the initial values.
Its backward pass is compiled first, from zeros fed where it reads the
forward pass's tensors: the replicas start with the forward pass, so on two
cores two processes compile different kernels at once instead of taking
turns on the same ones, and each loads what the other compiled.
Once a step's kernels were all ready here, a marker in cellgraph's cache
(keyed by the step, Numba's version and its cache folder) says so, and later
jobs of that step skip this: loading a warm cache is the replicas' to do,
and this process would only take a core from them.

Examples
--------
>>> from types import SimpleNamespace
>>> remote = SimpleNamespace(cluster=SimpleNamespace(kind="connected"))  # its workers have caches of their own
>>> compile_beside(remote, worker=None) is None  # type: ignore[arg-type]
True
"""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path

import numba
import numpy as np

from cellgraph.dataflow.graph import Node, Tensor
from cellgraph.dataflow.kernels import cpu as cpu_kernels
from cellgraph.dataflow.kernels.compile_once import CompileEvent, add_listener, cache_dir
from cellgraph.dataflow.kernels.source_cache import sources_digest

from .job_state import JobState
from .training_graph import LoadedGraph, TrainingGraph, load

# How often, while kernels compile, the job's events say how many are ready (the monitor shows events).
NOTE_EVERY_S = 10.0


def compile_beside(state: JobState, worker: TrainingGraph) -> threading.Thread | None:
    """Start compiling ``worker``'s step on a thread of this process, for a local cluster's job; the thread."""
    if state.cluster.kind != "local" or not all(isinstance(a, np.ndarray) for a in state.spec.arrays):
        return None  # another machine's caches, or data that lives on the workers
    marker = _marker(worker)
    if marker is not None and marker.exists():
        return None  # compiled before on this machine, into these caches
    thread = threading.Thread(
        target=_compile, args=(state, worker, marker), name=f"cellgraph-{state.job_id}-compile", daemon=True
    )
    thread.start()
    return thread


def _compile(state: JobState, worker: TrainingGraph, marker: Path | None) -> None:
    began = noted = time.monotonic()
    me = threading.current_thread()
    ready = {"compiled": 0, "loaded": 0}

    def heard(event: CompileEvent) -> None:
        nonlocal noted
        if threading.current_thread() is not me:  # another thread of this process: not this job's
            return
        ready[event.how] += 1
        state.compiling = f"compiling kernels {sum(ready.values())} ({event.kernel})"
        if time.monotonic() - noted >= NOTE_EVERY_S:
            noted = time.monotonic()
            state.event(f"{state.compiling}: {_split(ready)} so far")

    remove = add_listener(heard)
    try:
        loaded = load(worker)
        batch = loaded.convert([array[: state.spec.batch_size] for array in state.spec.arrays])
        _backward_first(loaded, state.spec.batch_size)
        loaded.compute(worker.initial, batch)
    except Exception as err:  # noqa: BLE001 - the replicas compile what this could not, and report their own errors
        state.event(
            f"could not compile the job's kernels in this process ({type(err).__name__}: {err}); "
            "its replicas compile them"
        )
        return
    finally:
        remove()
        state.compiling = ""
    if sum(ready.values()):
        state.event(f"kernels ready in {time.monotonic() - began:.1f} s: {_split(ready)}")
    if marker is not None:
        marker.touch()


def _marker(worker: TrainingGraph) -> Path | None:
    """The file that says ``worker``'s kernels are in this machine's caches (``None``: no writable cache)."""
    folder = cache_dir("compiled")
    if folder is None:
        return None
    key = hashlib.sha256(worker.graphdef)
    # The kernels' cache folder is named by their sources' digest (kernels/source_cache.py): new sources, new marker.
    kernels = sources_digest(cpu_kernels.SOURCES)
    key.update(f"{numba.__version__} {getattr(numba.config, 'CACHE_DIR', '')} {kernels}".encode())
    return folder / f"step-{key.hexdigest()[:24]}"


def _backward_first(loaded: LoadedGraph, rows: int) -> None:
    """Run the step's backward pass alone (its kernels compile), zeros fed for the forward tensors it reads; nothing
    when a shape is not known but for its batch dimension (the whole step compiles it all then)."""
    forward = _ancestors([loaded.loss])
    backward = _ancestors(loaded.gradients) - forward
    reads = {t.name: t for node in backward for t in node.inputs if t.node in forward}
    if any(t.shape is None or sum(d is None for d in t.shape) > 1 for t in reads.values()):
        return
    zeros = {t: np.zeros(tuple(rows if d is None else d for d in t.shape), t.dtype) for t in reads.values()}
    loaded.session.run(list(loaded.gradients), zeros)


def _ancestors(tensors: list[Tensor]) -> set[Node]:
    """The nodes ``tensors`` are computed from, theirs included."""
    seen: set[Node] = set()
    todo = [t.node for t in tensors]
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo += [t.node for t in node.inputs] + list(node.control_inputs)
    return seen


def _split(ready: dict[str, int]) -> str:
    return f"{ready['compiled']} compiled, {ready['loaded']} loaded from the cache"


__all__ = ["NOTE_EVERY_S", "compile_beside"]
