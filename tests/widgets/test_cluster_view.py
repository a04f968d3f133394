"""ClusterView and the cluster's text summary on a real LocalCluster: roles, devices, memory, the dashboard link."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cellgraph.cluster.cluster import Cluster
from cellgraph.widgets import ClusterView
from cellgraph.widgets.reprs import cluster_bundle, cluster_text

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with Cluster.local(workers=2, ps=1) as local:
        yield local


@pytest.mark.slow
def test_the_view_lists_every_worker_with_its_role_devices_and_memory(cluster: Cluster) -> None:
    view = ClusterView(cluster)
    try:
        infos = cluster.workers()
        assert [(w["role"], w["task"], w["name"]) for w in view.workers] == [
            ("ps", 0, "ps-0"),
            ("worker", 0, "worker-0"),
            ("worker", 1, "worker-1"),
        ]
        assert [w["address"] for w in view.workers] == [w.address for w in infos]
        assert view.devices == cluster.devices()
        assert [w["devices"][0] for w in view.workers] == [
            "/job:ps/task:0/device:cpu:0",
            "/job:worker/task:0/device:cpu:0",
            "/job:worker/task:1/device:cpu:0",
        ]
        for row, info in zip(view.workers, infos):
            assert row["memory_limit"] == info.memory_limit > 0 and row["nthreads"] == info.nthreads == 1
            assert row["memory"] > 0  # the scheduler hears each worker's memory with its heartbeat
        assert view.dashboard_link == cluster.dashboard_link
        assert view.dashboard_link.startswith("http://127.0.0.1:")
        assert (view.scheduler, view.kind, view.closed, view.error) == (cluster.scheduler_address, "local", False, "")
        # The message the view's Refresh button sends, as the comm delivers it: the widget reads the cluster again.
        view.workers = []
        view.comm.handle_msg({"content": {"data": {"method": "custom", "content": {"type": "refresh"}}}, "buffers": []})
        assert len(view.workers) == 3
        assert repr(view) == f"<ClusterView of {cluster.scheduler_address} (local): 3 worker(s)>"
    finally:
        view.close()


@pytest.mark.slow
def test_the_text_summary_and_the_bundle(cluster: Cluster) -> None:
    text = cluster_text(cluster)
    lines = text.splitlines()
    assert lines[0] == f"Cluster {cluster.scheduler_address} (local), dashboard {cluster.dashboard_link}"
    for line, info in zip(lines[1:], cluster.workers()):
        assert line.split()[:3] == [f"{info.role}/{info.task}", info.address, info.name]
        assert "1 thread(s)" in line
    assert len(lines) == 4
    assert cluster_bundle(cluster) == {"text/plain": text}  # outside a kernel: the text alone
    assert cluster._repr_mimebundle_() == {"text/plain": text}  # what IPython in a terminal shows
    bundle = cluster_bundle(cluster, widget=True)
    assert set(bundle) == {"text/plain", WIDGET_MIME} and bundle["text/plain"] == text
    assert set(cluster_bundle(cluster, include={"text/html"}, widget=True)) == {"text/plain"}


@pytest.mark.slow
def test_a_closed_cluster_says_so() -> None:
    small = Cluster.local(workers=1, ps=0)
    view: ClusterView | None = None
    try:
        view = ClusterView(small)
        assert [w["role"] for w in view.workers] == ["worker"]
    finally:
        small.close()
    assert view is not None
    view.refresh()
    assert view.closed and view.workers == [] and view.dashboard_link == ""
    assert view.error == "the cluster is closed: cg.Cluster.local() (or Cluster.connect) starts another"
    assert cluster_text(small) == f"Cluster {small.scheduler_address} (local), closed"
    view.close()
    # Displayed after close() (ipywidgets leaves IPython only the text): it says how to show the cluster anew.
    assert repr(view) == (
        f"<ClusterView of {small.scheduler_address} (local): 0 worker(s), closed: display the cluster again (or "
        "%cluster status) for a new view>"
    )


@pytest.mark.slow
def test_a_scheduler_without_workers_says_how_to_start_them_and_a_lost_one_says_so() -> None:
    # A Dask user's own scheduler, started with no workers: the view was an empty header, with nothing to do.
    from distributed import LocalCluster

    scheduler = LocalCluster(n_workers=0, host="127.0.0.1", dashboard_address=None)
    connected = Cluster.connect(scheduler.scheduler_address)
    view: ClusterView | None = None
    try:
        view = ClusterView(connected)
        address = connected.scheduler_address
        assert view.workers == [] and view.error == ""
        assert view.note == (
            f"no workers yet: start them with 'dask worker {address} --resources worker=1' (training) and "
            f"'dask worker {address} --resources ps=1' (a parameter server), then Refresh"
        )
        assert cluster_text(connected).splitlines()[1] == f"  {view.note.removesuffix(', then Refresh')}"
        # The scheduler goes away under the view: it said "AttributeError: 'NoneType' object has no attribute ...".
        scheduler.close()
        view.refresh()
        assert view.error.startswith(f"lost the Dask scheduler at {address} (Dask's client is "), view.error
        assert view.error.endswith(
            "is it still running? %cluster down, then %cluster connect ADDRESS (or %cluster up) when it is back"
        ), view.error
        assert "AttributeError" not in cluster_text(connected)
    finally:
        if view is not None:
            view.close()
        connected.close()
        scheduler.close()
