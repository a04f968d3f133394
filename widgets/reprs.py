"""Rich reprs: a ``Graph``, ``Job`` or ``Cluster`` shows as its widget in a kernel, and as a text summary elsewhere.

Their ``_repr_mimebundle_`` hand over to ``graph_bundle``, ``job_bundle`` and
``cluster_bundle``. The text summaries make no call to the parameter servers
(a repr must answer at once, even when they are gone); the cluster's asks its
scheduler for the workers and says so if it cannot.

Examples
--------
>>> class Job:  # doctest: +SKIP
...     def _repr_mimebundle_(self, include=None, exclude=None):
...         return job_bundle(self, include, exclude)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Container, Mapping
from typing import TYPE_CHECKING, Any

from .kernel_loop import in_kernel
from .training_monitor_data import MetricSeries, format_bytes, stragglers
from .training_monitor_events import fold_checkpoints

if TYPE_CHECKING:
    from cellgraph.cluster.cluster import Cluster
    from cellgraph.dataflow.graph import Graph

    from .training_monitor import MonitoredJob

TEXT = "text/plain"
LATEST_EVENTS = 3
SCOPES_NAMED, OPS_NAMED = 8, 10  # a graph's summary names this many top-level scopes and op types


def graph_text(graph: Graph) -> str:
    """A line on ``graph``'s size and top-level scopes, and one on its most common ops.

    Examples
    --------
    >>> print(graph_text(mlp().graph))  # doctest: +SKIP
    Graph: 47 nodes, 4 top-level scope(s): hidden, logits, gradients, Adam
    ops: MatMul ×6, ...
    """
    nodes = graph.nodes
    ops = Counter(n.op for n in nodes)
    scopes = list(dict.fromkeys(n.name.split("/", 1)[0] for n in nodes if "/" in n.name))
    text = f"Graph: {len(nodes)} node{'' if len(nodes) == 1 else 's'}"
    if scopes:
        more = " …" if len(scopes) > SCOPES_NAMED else ""
        text += f", {len(scopes)} top-level scope(s): " + ", ".join(scopes[:SCOPES_NAMED]) + more
    if ops:
        text += "\nops: " + ", ".join(f"{op} ×{n}" for op, n in ops.most_common(OPS_NAMED))
    return text


def job_text(job: MonitoredJob) -> str:
    """A few lines on ``job``: status, progress and ETA, last loss and step rate per replica, checkpoints, events.

    Examples
    --------
    >>> print(job_text(job))  # doctest: +SKIP
    Job job-1a2b3c4d: running, 2 replica(s)
      step 150 of 300 (50%), 24.1 steps/s, ETA 6 s
      loss: replica 0 0.4312, replica 1 0.441
      step rate: replica 0 12.1/s, replica 1 12/s
      checkpoints: 1, latest ckpt-100
      events: 2, latest:
        12:00:01 started 2 replica(s) in sync mode on ...
    """
    series = MetricSeries()
    series.extend(list(job.metrics))
    running = job.status == "running"
    replica_set = series.replica_set(job.replicas, running)
    lines = [
        f"Job {job.job_id}: {job.status}, " + (replica_set.describe() if running else f"{job.replicas} replica(s)"),
        "  " + series.progress(job.steps).describe(running=job.status == "running"),
    ]
    if series.replicas:
        losses = ", ".join(f"replica {r} {_last(series.curve(r, 'loss')[1])}" for r in series.replicas)
        rates = series.rates()
        slow = stragglers({r: rates[r] for r in replica_set.training})  # only replicas still training compare
        lines.append(f"  loss: {losses}")
        lines.append(
            "  step rate: "
            + ", ".join(f"replica {r} {rate:.3g}/s" for r, rate in rates.items())
            + (f" (straggler: {', '.join(f'replica {r}' for r in slow)})" if slow else "")
        )
    else:
        lines.append("  no metrics yet")
    if job.checkpoints:
        lines.append(f"  checkpoints: {len(job.checkpoints)}, latest {job.checkpoints[-1]}")
    folded = fold_checkpoints(list(job.events))  # checkpoints in one line: they would push the rest out
    if folded.summary or folded.others:
        lines.append(f"  events: {len(folded.others)}, latest:")
        lines += [f"    {e}" for e in ([folded.summary] if folded.summary else []) + folded.others[-LATEST_EVENTS:]]
    return "\n".join(lines)


def unreadable(cluster: Cluster, err: BaseException) -> str:
    """Why ``cluster``'s workers could not be read: a scheduler gone (Dask's client no longer ``running``) in words,
    anything else as the error."""
    status = str(getattr(cluster.client, "status", "running"))
    if status != "running":
        return (
            f"lost the Dask scheduler at {cluster.scheduler_address} (Dask's client is {status!r}): is it still "
            "running? %cluster down, then %cluster connect ADDRESS (or %cluster up) when it is back"
        )
    return f"could not read the cluster at {cluster.scheduler_address}: {type(err).__name__}: {err}"


def no_workers(cluster: Cluster) -> str:
    """What to do about a cluster with no workers (a scheduler started without any, or whose workers left)."""
    address = cluster.scheduler_address
    return (
        f"no workers yet: start them with 'dask worker {address} --resources worker=1' (training) and "
        f"'dask worker {address} --resources ps=1' (a parameter server), then Refresh"
    )


def cluster_text(cluster: Cluster) -> str:
    """A line for ``cluster`` and one per worker: role and task, address, name, threads, memory, GPUs.

    Examples
    --------
    >>> print(cluster_text(cluster))  # doctest: +SKIP
    Cluster tcp://127.0.0.1:40109 (local), dashboard http://127.0.0.1:8787/status
      ps/0      tcp://127.0.0.1:37047  ps-0      1 thread(s), 5.2 GiB
      worker/0  tcp://127.0.0.1:35761  worker-0  1 thread(s), 5.2 GiB
    """
    head = f"Cluster {cluster.scheduler_address} ({cluster.kind})"
    if cluster.closed:
        return head + ", closed"
    try:
        rows = cluster.workers()
        link = cluster.dashboard_link
    except Exception as err:  # a repr must not raise: say what could not be read
        return f"{head}: workers unknown ({unreadable(cluster, err)})"
    lines = [f"{head}, dashboard {link}" if link else head]
    if not rows:
        lines.append(f"  {no_workers(cluster).removesuffix(', then Refresh')}")
    width = max((len(_role(w.role, w.task)) for w in rows), default=0)
    for w in rows:
        gpus = f", {w.gpus} GPU(s)" if w.gpus else ""
        memory = format_bytes(w.memory_limit) if w.memory_limit else "no memory limit"
        lines.append(
            f"  {_role(w.role, w.task):<{width}}  {w.address}  {w.name}  {w.nthreads} thread(s), {memory}{gpus}"
        )
    return "\n".join(lines)


def _last(values: list[float]) -> str:
    return f"{values[-1]:.4g}" if values else "?"


def _role(role: str, task: int | None) -> str:
    return role if task is None else f"{role}/{task}"


def _filtered(
    bundle: Mapping[str, Any], include: Container[str] | None, exclude: Container[str] | None
) -> dict[str, Any]:
    """``bundle`` without the types left out by IPython's ``include`` / ``exclude`` (plain text always stays)."""
    return {
        kind: data
        for kind, data in bundle.items()
        if kind == TEXT or ((include is None or kind in include) and (exclude is None or kind not in exclude))
    }


def _widget_data(widget: Any) -> dict[str, Any]:
    """A widget's mimebundle data: ipywidgets returns a dict, anywidget a ``(data, metadata)`` pair."""
    bundle = widget._repr_mimebundle_()
    return dict(bundle[0] if isinstance(bundle, tuple) else bundle or {})


def graph_bundle(
    graph: Graph,
    include: Container[str] | None = None,
    exclude: Container[str] | None = None,
    *,
    widget: bool | None = None,
) -> dict[str, Any]:
    """``graph``'s mimebundle: its ``GraphView`` and a text summary, or the summary alone outside a kernel."""

    def view() -> Any:
        from .graph_view import GraphView

        return GraphView(graph)

    return _bundle(view, graph_text(graph), include, exclude, widget)


def job_bundle(
    job: MonitoredJob,
    include: Container[str] | None = None,
    exclude: Container[str] | None = None,
    *,
    widget: bool | None = None,
) -> dict[str, Any]:
    """``job``'s mimebundle: its ``TrainingMonitor`` and a text summary, or the summary alone outside a kernel."""

    def monitor() -> Any:
        from .training_monitor import TrainingMonitor

        return TrainingMonitor(job)

    return _bundle(monitor, job_text(job), include, exclude, widget)


def cluster_bundle(
    cluster: Cluster,
    include: Container[str] | None = None,
    exclude: Container[str] | None = None,
    *,
    widget: bool | None = None,
) -> dict[str, Any]:
    """``cluster``'s mimebundle: its ``ClusterView`` and a text summary, or the summary alone outside a kernel."""

    def view() -> Any:
        from .cluster_view import ClusterView

        return ClusterView(cluster)

    return _bundle(view, cluster_text(cluster), include, exclude, widget)


def _bundle(
    make_widget: Callable[[], Any],
    text: str,
    include: Container[str] | None,
    exclude: Container[str] | None,
    widget: bool | None,
) -> dict[str, Any]:
    """The widget's data (made only when shown) with ``text`` as its plain text, filtered by IPython's choice.

    ``widget`` forces the choice; by default the widget is made only inside
    an IPython kernel, where a front end can draw it. Each widget module is
    imported by ``make_widget``: a plain process never loads the widget stack.
    """
    shown = in_kernel() if widget is None else widget
    data = _widget_data(make_widget()) if shown else {}
    data[TEXT] = text
    return _filtered(data, include, exclude)
