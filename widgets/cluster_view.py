"""``ClusterView(cluster)``: a cluster's workers with their roles, devices and memory, and its Dask dashboard.

An anywidget: this class reads the cluster into plain traits (a list of
worker dicts, the device names, the dashboard link); ``cluster_view.js``
draws them as a table. ``refresh()`` reads the cluster again (the view's
Refresh button asks for it), so a worker that was lost or joined shows.

Examples
--------
>>> view = ClusterView(cluster)  # doctest: +SKIP
>>> [(w["role"], w["task"]) for w in view.workers]  # doctest: +SKIP
[('ps', 0), ('worker', 0), ('worker', 1)]
>>> view.dashboard_link  # doctest: +SKIP
'http://127.0.0.1:8787/status'
"""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anywidget
import traitlets

from .reprs import no_workers, unreadable

if TYPE_CHECKING:
    from cellgraph.cluster.cluster import Cluster, WorkerInfo


# Every view made in this process, for ``refresh_views_of``: weakly, as a view goes with its output.
_VIEWS: weakref.WeakSet[ClusterView] = weakref.WeakSet()


def refresh_views_of(cluster: Cluster) -> None:
    """Read ``cluster`` again in each open view of it: ``%cluster down`` calls this, so that a view shown earlier
    says the cluster is closed instead of listing the workers it had."""
    for view in list(_VIEWS):
        if view.cluster is cluster and view.comm is not None:
            view.refresh()


def worker_row(info: WorkerInfo, devices: list[str]) -> dict[str, Any]:
    """One worker as the view shows it: what ``cluster.workers()`` says (memory in use -1: unknown), its devices."""
    return {
        "address": info.address,
        "name": info.name,
        "role": info.role,
        "task": info.task,
        "host": info.host,
        "nthreads": info.nthreads,
        "memory": info.memory,
        "memory_limit": info.memory_limit,
        "gpus": info.gpus,
        "devices": devices,
    }


def devices_of(info: WorkerInfo, devices: list[str]) -> list[str]:
    """The names in ``devices`` (``cluster.devices()``) that live on worker ``info``."""
    if info.task is None:
        return []
    prefix = f"/job:{info.role}/task:{info.task}/"
    return [d for d in devices if d.startswith(prefix)]


class ClusterView(anywidget.AnyWidget):
    """A cluster's workers (role, task, host, threads, memory, devices) and its Dask dashboard link.

    Parameters
    ----------
    cluster
        A ``cg.Cluster`` (open or closed).

    Examples
    --------
    >>> ClusterView(cg.Cluster.local(workers=2, ps=1))  # the last value of a cell  # doctest: +SKIP
    """

    _esm = Path(__file__).with_name("cluster_view.js")
    scheduler = traitlets.Unicode("").tag(sync=True)
    kind = traitlets.Unicode("").tag(sync=True)
    dashboard_link = traitlets.Unicode("").tag(sync=True)
    workers = traitlets.List(traitlets.Dict()).tag(sync=True)
    devices = traitlets.List(traitlets.Unicode()).tag(sync=True)
    closed = traitlets.Bool(False).tag(sync=True)
    error = traitlets.Unicode("").tag(sync=True)
    note = traitlets.Unicode("").tag(sync=True)  # what to do about it, when there is nothing to list

    def __init__(self, cluster: Cluster) -> None:
        super().__init__()
        self.cluster = cluster
        self.on_msg(self._on_message)
        self.refresh()
        _VIEWS.add(self)

    def refresh(self) -> None:
        """Read the cluster's workers, devices, memory and dashboard link again (calls to its scheduler)."""
        cluster = self.cluster
        with self.hold_sync():
            # A colocated cluster has no PS worker to list: the title says where each job's shards run.
            kind = cluster.kind + (
                ", a PS shard in each training worker" if cluster.ps_placement == "colocated" else ""
            )
            self.scheduler, self.kind, self.closed = cluster.scheduler_address, kind, cluster.closed
            if cluster.closed:
                self.workers, self.devices, self.dashboard_link = [], [], ""
                self.error = "the cluster is closed: cg.Cluster.local() (or Cluster.connect) starts another"
                return
            try:
                infos = cluster.workers()
                devices = cluster.devices()
                self.dashboard_link = cluster.dashboard_link
            except Exception as err:  # a view must still show: say what could not be read, keep what was
                self.error = unreadable(cluster, err)
                return
            self.workers = [worker_row(w, devices_of(w, devices)) for w in infos]
            self.devices, self.error = devices, ""
            self.note = "" if infos else no_workers(cluster)

    def _on_message(self, _: Any, content: Any, buffers: Any) -> None:
        if isinstance(content, dict) and content.get("type") == "refresh":
            self.refresh()

    def __repr__(self) -> str:
        head = f"<ClusterView of {self.scheduler} ({self.kind}): {len(self.workers)} worker(s)"
        if self.comm is None:  # closed: IPython shows only this text now, where the view was (ipywidgets' close)
            return head + ", closed: display the cluster again (or %cluster status) for a new view>"
        return head + ">"
