"""``%load_ext cellgraph``: what the extension keeps per shell, and loading and unloading it.

Loading registers the magics and the cell tracker's hooks; loading again does
nothing more. Unloading takes them away but keeps the named graphs, the cluster
and the jobs (they live on in the notebook's namespace), so that
``%reload_ext cellgraph`` finds them again.
"""

from __future__ import annotations

import atexit
import contextlib
import sys
import warnings
from typing import TYPE_CHECKING, Any

from cellgraph.dataflow.graph import Graph

from . import completions, tracebacks
from .cells import CellTracker, RunningJob

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.core.magic import Magics

    from cellgraph.cluster.cluster import Cluster
    from cellgraph.cluster.job import Job

_ATTRIBUTE = "_cellgraph_extension"  # where a shell keeps its Extension


class Extension:
    """One shell's cellgraph state: named graphs, the cell tracker, and the cluster and jobs the magics started."""

    def __init__(self, shell: InteractiveShell) -> None:
        self.shell = shell
        self.graphs: dict[str, Graph] = {}
        self.tracker = CellTracker(shell, lambda: list(self.graphs.values()), self.running_jobs)
        self.cluster: Cluster | None = None
        self.jobs: list[Job] = []
        self.magics: list[Magics] = []
        self.completions: completions.MagicMatcher | None = None  # the magics' tab completion
        self.loaded = False
        self.showing_errors = False  # its handler shows cellgraph's errors (tracebacks.py)
        self.warning_format: tracebacks.WarningFormat | None = None
        self._atexit = False

    def live_jobs(self) -> list[tuple[Job, str | None]]:
        """The jobs still starting or running, each with the notebook's name for it (``None`` if it has none): those
        %train started, and any ``cg.train`` job the notebook holds by a name."""
        if "cellgraph.cluster.job" not in sys.modules:  # no job can exist, and Dask need not be imported
            return []
        from cellgraph.cluster.job import Job

        found = {id(job): job for job in self.jobs}
        names: dict[int, str] = {}
        for name, value in list(self.shell.user_ns.items()):
            if isinstance(value, Job) and not name.startswith("_"):  # not Out's _, __, _7
                found.setdefault(id(value), value)
                names.setdefault(id(value), name)
        return [(job, names.get(key)) for key, job in found.items() if job.status in ("starting", "running")]

    def running_jobs(self) -> list[RunningJob]:
        """``live_jobs`` as the cell tracker needs them: a re-run cell warns that they keep training the graph as
        it was."""
        return [
            RunningJob(job.job_id, job.status, job.loss, name, any(job is mine for mine in self.jobs))
            for job, name in self.live_jobs()
        ]

    def current_cluster(self) -> Cluster | None:
        """The open cluster the magics work on: the one ``%cluster`` started, else a ``cg.Cluster`` named ``cluster``."""
        if self.cluster is not None and not self.cluster.closed:
            return self.cluster
        candidate = self.shell.user_ns.get("cluster")
        if candidate is None:
            return None
        from cellgraph.cluster.cluster import Cluster

        return candidate if isinstance(candidate, Cluster) and not candidate.closed else None

    def adopt_cluster(self, cluster: Cluster) -> None:
        """Keep ``cluster`` as the current one, bound to ``cluster`` in the namespace, and close it at exit."""
        self.cluster = cluster
        self.shell.user_ns["cluster"] = cluster
        if not self._atexit:
            # A kernel that exits (shutdown, restart) must not leave the LocalCluster's processes behind.
            atexit.register(self._close_at_exit)
            self._atexit = True

    def _close_at_exit(self) -> None:
        # At exit the shell may be half torn down; there is no one left to tell of a failure.
        with contextlib.suppress(Exception):
            self.close_cluster()

    def close_cluster(self) -> Cluster | None:
        """Close the current cluster and the jobs the magics started on it; return it (``None`` if none was open)."""
        cluster = self.current_cluster()
        if cluster is None:
            return None
        for job in [j for j in self.jobs if j.cluster is cluster]:
            with contextlib.suppress(Exception):  # the cluster closes anyway; its job's processes go with it
                job.close()
            self.jobs.remove(job)
        cluster.close()
        views = sys.modules.get("cellgraph.widgets.cluster_view")  # not imported: no view was ever made
        if views is not None:
            with contextlib.suppress(Exception):  # a view that cannot redraw must not fail the close
                views.refresh_views_of(cluster)
        if self.shell.user_ns.get("cluster") is cluster:
            del self.shell.user_ns["cluster"]
        if self.cluster is cluster:
            self.cluster = None
        return cluster


def extension_of(shell: InteractiveShell) -> Extension:
    """The shell's Extension, made on first use."""
    ext = getattr(shell, _ATTRIBUTE, None)
    if ext is None:
        ext = Extension(shell)
        setattr(shell, _ATTRIBUTE, ext)
    return ext


def named_graphs(shell: InteractiveShell | None = None) -> dict[str, Graph]:
    """The named graphs of ``shell`` (default: the running one); ``cellgraph.kernel_ext.named_graphs`` calls this."""
    if shell is None:
        from IPython import get_ipython

        shell = get_ipython()
        if shell is None:
            raise RuntimeError("named_graphs() needs a running IPython (a notebook kernel); none is running")
    return extension_of(shell).graphs


def load_ipython_extension(ipython: Any) -> None:
    """Register the magics and the cell tracker (``%load_ext cellgraph``); loading twice does nothing more."""
    from .magics_cluster import ClusterMagics
    from .magics_export import ExportMagics
    from .magics_graph import GraphMagics
    from .magics_train import TrainMagics

    ext = extension_of(ipython)
    if ext.loaded:
        return
    ext.magics = [GraphMagics(ipython, ext), ClusterMagics(ipython, ext), TrainMagics(ipython, ext)]
    ext.magics.append(ExportMagics(ipython, ext))
    for magics in ext.magics:
        ipython.register_magics(magics)
    ext.completions = completions.register(ipython, ext.magics)
    ext.tracker.register()
    if not ipython.custom_exceptions:  # a handler of the user's own stays
        ipython.set_custom_exc(tracebacks.ERRORS, tracebacks.show)
        ext.showing_errors = True
    ext.warning_format = tracebacks.WarningFormat(ipython, warnings.formatwarning)
    ext.warning_format.install()
    ext.loaded = True


def unload_ipython_extension(ipython: Any) -> None:
    """Take the magics and the cell tracker away (``%unload_ext cellgraph``); graphs, cluster and jobs stay."""
    ext = extension_of(ipython)
    if not ext.loaded:
        return
    ext.tracker.unregister()
    completions.unregister(ipython, ext.completions)
    ext.completions = None
    if ext.showing_errors and ipython.custom_exceptions == tracebacks.ERRORS:
        ipython.set_custom_exc((), None)
    ext.showing_errors = False
    if ext.warning_format is not None:
        ext.warning_format.uninstall()
        ext.warning_format = None
    manager = ipython.magics_manager
    for magics in ext.magics:
        for kind, table in magics.magics.items():
            for name, method in table.items():
                # Only our own entry: a magic of the same name registered later by someone else stays.
                if manager.magics[kind].get(name) == method:
                    del manager.magics[kind][name]
        if manager.registry.get(type(magics).__name__) is magics:
            del manager.registry[type(magics).__name__]
    ext.magics = []
    ext.loaded = False
