"""%cluster, %placement and %train on a real LocalCluster, as a notebook uses them: up, place, train, scale, down."""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell

import cellgraph as cg
from cellgraph.cluster.cluster import Cluster
from cellgraph.cluster.job import Job
from cellgraph.kernel_ext.cells import ActiveCell, RunningJob, job_note
from cellgraph.kernel_ext.display import PlacementTable
from cellgraph.kernel_ext.extension import extension_of
from cellgraph.widgets import ClusterView

from .shells import new_shell, ok, refused, run

TIMEOUT = 120.0
PS, WORKER = "/job:ps/task:0/device:cpu:0", "/job:worker/task:0/device:cpu:0"
# The digits MLP, built in a cell into the default graph, as a notebook would.
MODEL = """\
import cellgraph as cg
from cellgraph.examples import digits
data = digits.load()
x = cg.placeholder((None, 64), "float32", name="x")
y = cg.placeholder((None,), "int32", name="y")
logits = cg.layers.dense(cg.layers.dense(x, 32, activation="relu", name="hidden"), 10, name="logits")
loss = cg.losses.sparse_softmax_cross_entropy(logits, y)
"""
DATA = "--data data.x_train,data.y_train"


@pytest.fixture(scope="module")
def notebook() -> Iterator[InteractiveShell]:
    """A shell with the MLP built and ``%cluster up --workers 2 --ps 1`` run; ``%cluster down`` at the end, whatever happens."""
    for shell in new_shell():
        try:
            ok(shell, MODEL)
            ok(shell, "%cluster up --workers 2 --ps 1")
            yield shell
        finally:
            ok(shell, "%cluster down")
            assert extension_of(shell).current_cluster() is None


def kind_of(name: str) -> type | None:
    """The widget class, or None where it cannot be imported (the magics then show the object itself)."""
    import importlib

    module, cls = (
        {"ClusterView": "cluster_view", "TrainingMonitor": "training_monitor", "GraphView": "graph_view"}[name],
        name,
    )
    try:
        return getattr(importlib.import_module(f"cellgraph.widgets.{module}"), cls)  # type: ignore[no-any-return]
    except ImportError:
        return None


def assert_shown_as(item: Any, widget: str, obj: Any) -> None:
    cls = kind_of(widget)
    assert isinstance(item, cls) if cls is not None else item is obj, item


@pytest.mark.slow
def test_cluster_up_binds_a_local_cluster(
    notebook: InteractiveShell, capsys: pytest.CaptureFixture[str], shown: list[Any]
) -> None:
    cluster = notebook.user_ns["cluster"]
    assert isinstance(cluster, Cluster) and cluster.kind == "local" and not cluster.closed
    assert len(cluster.ps_workers()) == 1 and len(cluster.training_workers()) == 2
    ok(notebook, "%cluster status")
    assert len(shown) == 1
    assert_shown_as(shown[0], "ClusterView", cluster)
    err = refused(notebook, capsys, "%cluster up --workers 3")
    assert err == (
        f"UsageError: %cluster up: a cluster is up already ({cluster.scheduler_address}, shown above): %cluster down "
        "first\n"
    )
    assert len(shown) == 2
    assert_shown_as(shown[1], "ClusterView", cluster)  # the re-run cell's view, cleared by the re-run
    assert notebook.user_ns["cluster"] is cluster and len(cluster.training_workers()) == 2
    # More replicas than training workers, in the magic's words (cg.train's said 'pass replicas=2').
    err = refused(notebook, capsys, f"%train loss {DATA} --replicas 3 --no-show")
    assert err.startswith(
        "UsageError: %train: --replicas 3 needs 3 training workers and the cluster has 2: give --replicas 2 (or leave "
        "it out: one per training worker), or run %cluster scale 3 first\n"
    ), err
    # cg.train's refusals in the magic's flags: it said 'pass batch_size<=719', a keyword %train cannot take.
    for line, words in [
        ("--batch-size 5000", "--batch-size 5000 is larger than a replica's shard (719 rows: 1438 over 2 replicas): "
                              "pass --batch-size 719 or less, or fewer replicas"),
        ("--replicas-to-aggregate 3", "--replicas-to-aggregate must be between 1 and replicas (2), got 3"),
        ("--mode async --replicas-to-aggregate 1", "--replicas-to-aggregate is for --mode sync (async mode applies "
                                                   "every gradient on arrival), got 1"),
    ]:  # fmt: skip
        err = refused(notebook, capsys, f"%train loss {DATA} {line} --no-show")
        assert err == f"UsageError: %train: {words}\n", err
    assert "job" not in notebook.user_ns


@pytest.mark.slow
def test_placement_shows_the_graph_by_device_and_a_table(notebook: InteractiveShell, shown: list[Any]) -> None:
    ok(notebook, "%placement")
    view, table = shown
    assert isinstance(table, PlacementTable)
    placement = table.placement
    assert view.placement is placement if kind_of("GraphView") else view is notebook.user_ns["cg"].get_default_graph()
    rows = {node: (op, device, reason) for node, op, device, reason in table.rows()}
    assert rows["hidden/kernel"][:2] == ("Variable", PS) and "ps" in rows["hidden/kernel"][2]
    assert rows["hidden/matmul"][:2] == ("MatMul", WORKER)
    html = table._repr_html_()
    assert html.startswith("<table>") and "<td style='text-align:left'>hidden/kernel</td>" in html
    assert f"ps load {PS}:" in html and "hidden/kernel" in repr(table) and "reason" in repr(table)


@pytest.mark.slow
def test_train_launches_a_job_binds_it_and_returns_at_once(
    notebook: InteractiveShell, capsys: pytest.CaptureFixture[str], shown: list[Any]
) -> None:
    ok(notebook, f"%train loss {DATA} --mode async --steps 1000000 --batch-size 32 --checkpoint-every 1000")
    job = notebook.user_ns["job"]
    try:
        # It returned before the job started (issue 18, item 15): servers and replicas start on the job's thread.
        assert isinstance(job, Job) and job.status == "starting" and job.replicas == 2
        assert_shown_as(shown[0], "TrainingMonitor", job)
        err = refused(notebook, capsys, f"%train loss {DATA}")
        assert re.search(rf"%train: job {job.job_id} is still (starting|running) on this cluster: job.stop\(\)", err)
        job.global_step()  # waits for the start
        assert job.status == "running"  # a million steps, and nothing stopped it
        err = refused(notebook, capsys, f"%train loss {DATA}")
        assert f"%train: job {job.job_id} is still running on this cluster: job.stop() (or job.close()) first" in err
        assert "usage:" not in err  # about the job, not the arguments
        assert notebook.user_ns["job"] is job
        # Re-running the cell cleared the job's monitor from it: each refusal shows it again.
        assert len(shown) == 3 and all(getattr(item, "job", job) is job for item in shown)
        job.stop(timeout=TIMEOUT)
        assert job.status == "stopped"
    finally:
        job.close()
    ok(notebook, f"%train loss {DATA} --steps 30 --batch-size 32 --optimizer momentum:1e-2 --momentum 0.5 --nesterov "
                 "--no-show")  # fmt: skip
    second = notebook.user_ns["job"]
    try:
        assert second is not job and len(shown) == 3  # --no-show
        config = second._state.spec.optimizer  # what the parameter servers apply
        assert (config.kind, config.learning_rate, config.momentum, config.nesterov) == ("momentum", 1e-2, 0.5, True)
        second.wait(TIMEOUT)
        assert second.status == "finished" and second.global_step() == 30
        assert set(second.variables()) >= {"hidden/kernel", "logits/kernel"}
    finally:
        second.close()


@pytest.mark.slow
def test_train_resumes_from_the_checkpoints_of_an_earlier_job(notebook: InteractiveShell) -> None:
    ok(notebook, f"%train loss {DATA} --steps 30 --batch-size 32 --checkpoint-every 10 --no-show")
    first = notebook.user_ns["job"]
    try:
        first.wait(TIMEOUT)
        assert first.status == "finished" and first.global_step() == 30
        folder = first.checkpoint_dir
    finally:
        first.close()
    # The folder a finished job leaves: the new job starts at its latest checkpoint and checkpoints on into it.
    ok(
        notebook,
        f"%train loss {DATA} --steps 50 --batch-size 32 --checkpoint-every 10 --no-show --resume-from {folder}",
    )
    second = notebook.user_ns["job"]
    try:
        second.wait(TIMEOUT)
        assert second.status == "finished" and second.global_step() == 50
        assert second.checkpoint_dir == folder
        assert any(
            event.endswith("resumed from checkpoint ckpt-0000000030 at global step 30") for event in second.events
        )
    finally:
        second.close()


# A small model in a named graph (a %%graph cell) and its loss built in a plain cell, each re-run while a job trains.
SMALL = """%%graph small --no-show
sx = cg.placeholder((None, 64), "float32", name="x")
sy = cg.placeholder((None,), "int32", name="y")
slogits = cg.layers.dense(sx, 10, name="logits")
"""
SMALL_LOSS = "with small.as_default():\n    small_loss = cg.losses.sparse_softmax_cross_entropy(slogits, sy)\n"
SMALL_EXTRA = "with small.as_default():\n    extra = cg.constant(1.0, name='extra')\n"


def job_warnings(shell: InteractiveShell, source: str, cell_id: str) -> tuple[int, list[str]]:
    """Run a cell that must succeed; its ``In [n]`` and the warnings it gave about jobs."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        number = ok(shell, source, cell_id).execution_count
    return number, [str(w.message) for w in caught if w.category is cg.CellgraphWarning and " job " in str(w.message)]


@pytest.mark.slow
def test_a_cell_re_run_while_a_job_trains_its_graph_says_the_job_trains_the_old_one(notebook: InteractiveShell) -> None:
    # Re-running the model's cell while a job trained it said nothing: the job goes on with the graph it started
    # with, and the user thought the new one trained.
    ok(notebook, SMALL, "small-model")
    ok(notebook, SMALL_LOSS, "small-loss")
    ok(notebook, SMALL_EXTRA, "small-extra")
    ok(notebook, f"%train small_loss {DATA} --mode async --steps 1000000 --batch-size 32 --no-show")
    job = notebook.user_ns["job"]
    try:
        job.global_step()  # waits for the start
        advice = "the job keeps training the graph as it was when it started. To train the new graph: job.stop(), then %train again"
        n, said = job_warnings(notebook, SMALL, "small-model")  # a %%graph cell
        assert said == [
            f"re-running cell [{n}] changed 6 node(s) that the running job {job.job_id} trains ('logits/bias', "
            f"'logits/bias_add', 'logits/kernel', ...); {advice}"
        ], said
        n, said = job_warnings(notebook, SMALL_LOSS, "small-loss")  # a plain cell
        assert len(said) == 1 and said[0].startswith(f"re-running cell [{n}] changed ") and said[0].endswith(advice)
        # A node the loss does not use, or a cell that raised (rolled back), changes nothing the job trains.
        assert job_warnings(notebook, SMALL_EXTRA, "small-extra")[1] == []
        assert not run(notebook, SMALL_LOSS + "1 / 0\n", "small-loss").success
        job.stop(timeout=TIMEOUT)
        assert job_warnings(notebook, SMALL, "small-model")[1] == []  # a stopped job trains nothing
    finally:
        job.close()


def test_a_cg_train_job_is_told_to_start_again_with_cg_train() -> None:
    # The words for a job a plain cell started (cg.train), bound to a name of the user's: the cell re-run replaces
    # the loss's own node.
    graph = cg.Graph()
    with graph.as_default(), cg.cell_scope("model", "[1]"):
        loss = cg.reduce_sum(cg.placeholder((None, 3), "float32", name="x"), name="loss")
    with graph.as_default(), cg.cell_scope("model", "[2]") as rerun:
        cg.reduce_sum(cg.placeholder((None, 3), "float32", name="x"), name="loss")
    active = ActiveCell(None, "model", "[2]", runs=[rerun])
    note = job_note(active, RunningJob("job-1234abcd", "starting", loss, "mine", magic=False))
    assert note == (
        "re-running cell [2] changed 2 node(s) that the starting job job-1234abcd trains ('loss', 'x'); the job keeps "
        "training the graph as it was when it started. To train the new graph: mine.stop(), then cg.train(...) again"
    )


@pytest.mark.slow
def test_scale_changes_the_training_workers(
    notebook: InteractiveShell, capsys: pytest.CaptureFixture[str], shown: list[Any]
) -> None:
    cluster = notebook.user_ns["cluster"]
    capsys.readouterr()
    ok(notebook, "%cluster scale 3")
    assert "training workers: 2 -> 3" in capsys.readouterr().out
    assert len(cluster.training_workers()) == 3 and len(cluster.ps_workers()) == 1
    assert "/job:worker/task:2/device:cpu:0" in cluster.devices()
    ok(notebook, "%cluster scale 2")
    assert "training workers: 3 -> 2" in capsys.readouterr().out
    assert len(cluster.training_workers()) == 2 and len(cluster.ps_workers()) == 1
    assert len(shown) == 2


@pytest.mark.slow
def test_cluster_up_with_colocated_servers(shell: InteractiveShell, shown: list[Any]) -> None:
    # As Cluster.local(ps="colocated"): no PS process, a shard in each training worker of every job.
    ok(shell, "%cluster up --workers 1 --ps colocated")
    try:
        cluster = shell.user_ns["cluster"]
        assert cluster.ps_placement == "colocated" and cluster.ps_workers() == []
        assert len(cluster.training_workers()) == 1
        view = shown[0]  # the cluster view (or the cluster itself without the widget) says where shards run
        assert "a PS shard in each training worker" in getattr(view, "kind", "a PS shard in each training worker")
        ok(shell, MODEL)
        ok(shell, "%placement")
        table = shown[-1]
        assert isinstance(table, PlacementTable)
        # The variables go to the shard in the training worker's process, as a colocated job places them.
        assert table.placement.device_of["hidden/kernel"] == PS
        assert "no ps task among the devices" not in table.placement.reasons["hidden/kernel"]
    finally:
        ok(shell, "%cluster down")


@pytest.mark.slow
def test_train_on_a_cluster_without_training_workers_says_so(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str], shown: list[Any]
) -> None:
    # As after its training workers died: not "replicas must be an int of at least 1, got 0".
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, processes=False, resources={"ps": 1}, dashboard_address=None) as local:
        with Client(local) as client:
            ok(shell, MODEL)
            shell.user_ns["cluster"] = Cluster.from_client(client)
            assert shell.user_ns["cluster"].training_workers() == []
            err = refused(shell, capsys, f"%train loss {DATA} --no-show")
            wrapped = shell.user_ns.pop("cluster")
            address = wrapped.scheduler_address
            wrapped.close()
    assert err.startswith(
        f"UsageError: %train: the cluster at {address} has no training workers now (%cluster status lists them): "
        "give a worker the Dask resource 'worker'"
    ), err
    assert "job" not in shell.user_ns and shown == []


@pytest.mark.slow
def test_down_closes_the_cluster_and_its_jobs(notebook: InteractiveShell, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = notebook.user_ns["cluster"]
    ok(notebook, f"%train loss {DATA} --mode async --steps 1000000 --batch-size 32 --no-show")
    job = notebook.user_ns["job"]
    job.global_step()  # waits for the start
    view = ClusterView(cluster)  # as %cluster up showed it
    capsys.readouterr()
    ok(notebook, "%cluster down")
    # The view went on listing the workers of the closed cluster, and its dashboard link.
    assert view.closed and view.workers == [] and view.dashboard_link == ""
    assert view.error == "the cluster is closed: cg.Cluster.local() (or Cluster.connect) starts another"
    # It said only "closed the cluster at ...": the running job stopped without a word.
    out = capsys.readouterr().out
    assert re.fullmatch(
        f"closed the cluster at {cluster.scheduler_address}\n"
        f"job {job.job_id} \\(`job`\\), which was running on it, is stopped at global step \\d+ of 1000000\n",
        out,
    ), out
    assert cluster.closed and "cluster" not in notebook.user_ns and job._closed
    assert extension_of(notebook).jobs == []


@pytest.mark.slow
def test_a_dask_users_own_scheduler_without_workers_then_disconnected(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str], shown: list[Any]
) -> None:
    # `dask scheduler` started by hand, no workers yet. %train --replicas 1 said "pass replicas=0, or start the
    # cluster with workers=1", and %cluster down "closed the cluster at ...", of a cluster it left running.
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=0, host="127.0.0.1", dashboard_address=None) as scheduler:
        address = scheduler.scheduler_address
        ok(shell, MODEL)
        ok(shell, f"%cluster connect {address}")
        for line in (f"%train loss {DATA} --replicas 1 --no-show", f"%train loss {DATA} --no-show"):
            err = refused(shell, capsys, line)
            assert err.startswith(
                f"UsageError: %train: the cluster at {address} has no training workers now (%cluster status lists "
                f"them): start one with 'dask worker {address} --resources worker=1'"
            ), err
        capsys.readouterr()
        ok(shell, "%cluster down")
        assert capsys.readouterr().out == (
            f"disconnected from the cluster at {address} (connected): its scheduler and workers keep running\n"
        )
        assert "cluster" not in shell.user_ns
        with Client(address, timeout=10) as client:  # the scheduler still answers
            assert client.scheduler_info()["address"] == address


@pytest.mark.slow
def test_train_and_placement_on_a_scheduler_that_is_gone_say_so(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str], shown: list[Any]
) -> None:
    # A Dask user's scheduler stopped under a joined cluster: %train printed 80 lines of Dask's connection pool
    # ending in "CommClosedError: ConnectionPool closing."
    from distributed import LocalCluster

    scheduler = LocalCluster(n_workers=0, host="127.0.0.1", dashboard_address=None)
    address = scheduler.scheduler_address
    try:
        ok(shell, MODEL)
        ok(shell, f"%cluster connect {address}")
        scheduler.close()
        for line in (f"%train loss {DATA} --no-show", "%placement"):
            err = refused(shell, capsys, line)
            magic = line.split()[0]
            # Lost (Dask's client gave up) or silent (a ClusterError at its deadline), depending on the moment.
            lost = f"UsageError: {magic}: lost the Dask scheduler at {address} (Dask's client is "
            silent = f"UsageError: {magic}: could not read the cluster at {address}: ClusterError: the Dask scheduler"
            assert err.startswith((lost, silent)), err
            assert "Traceback" not in err and "ConnectionPool" not in err, err
    finally:
        ok(shell, "%cluster down")
        scheduler.close()
