"""``%%graph [NAME]``: build a cell into a named graph and show it (``%graph NAME`` shows it again);
``%placement [GRAPH]``: where each op would run."""

from __future__ import annotations

import ast
import keyword
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, kwds, magic_arguments

from cellgraph.dataflow.errors import CellgraphError
from cellgraph.dataflow.graph import Graph, get_default_graph
from cellgraph.dataflow.placement import STRATEGIES, place

from .arguments import NO_CLUSTER, MagicFormatter, ask_cluster, parse, usage_error
from .display import PlacementTable, show, show_as

if TYPE_CHECKING:
    from cellgraph.cluster.job import Job

    from .extension import Extension


@magics_class
class GraphMagics(Magics):
    """``%%graph`` and ``%placement``."""

    def __init__(self, shell: Any, ext: Extension) -> None:
        super().__init__(shell)
        self.ext = ext

    @magic_arguments()
    @kwds(formatter_class=MagicFormatter)
    @argument("-h", "--help", action="store_true", help="show this help and do nothing")
    @argument("--no-show", action="store_true", help="with a cell: do not display the graph at the end")
    @argument("name", nargs="?", metavar="NAME", help="the graph, made if new (default: the default graph)")
    @line_cell_magic
    def graph(self, line: str, cell: str | None = None) -> None:
        """%%graph [NAME]: run the cell with graph NAME as the default graph, then display it.
        %graph [NAME]: display graph NAME.

        Re-running a cell replaces the nodes it made before, in whichever graph
        it made them; a cell that raises leaves every graph as it was. A named
        graph is bound to NAME in the notebook (as %%capture NAME binds its
        output) and is also cellgraph.kernel_ext.named_graphs()[NAME].
        """
        __tracebackhide__ = True  # an error in the cell shows the cell's lines, not the magic's
        args = parse(self.graph, line, cell=cell is not None)
        if args is None:
            return
        if cell is None:
            show_as("graph_view", "GraphView", self._graph(args.name, self.graph)[0])
            return
        if args.name is None:
            target = get_default_graph()
        else:  # not `get(...) or`: a graph with no nodes is falsy
            named = self.ext.graphs.get(args.name)
            target = named if named is not None else _labelled(args.name)
        active = self.ext.tracker.active
        if active is not None:
            active.join(target)
        assert self.shell is not None
        before = self.shell.user_ns.get(args.name, _UNSET) if args.name is not None else _UNSET
        with target.as_default():
            self._run(cell, line)
        # A new graph is kept only once its cell has run: a failed first run leaves no empty graph behind.
        if args.name is not None:
            self.ext.graphs.setdefault(args.name, target)
            self._bind(args.name, target, before)
        if not args.no_show:
            show_as("graph_view", "GraphView", target)

    def _bind(self, name: str, graph: Graph, before: object) -> None:
        """``NAME = graph`` in the notebook, as ``%%capture NAME`` binds its output; a value the cell itself gave
        ``NAME`` stays (it is what the user wrote last), and a line says where the graph is then."""
        assert self.shell is not None
        if not name.isidentifier() or keyword.iskeyword(name):  # %%graph my-model: no variable can have that name
            return
        ns = self.shell.user_ns
        now = ns.get(name, _UNSET)
        if now is not graph and now is not before:
            print(
                f"%%graph {name}: the cell bound {name} itself (a {type(now).__name__}), so {name} stays that; "
                f"the graph is cellgraph.kernel_ext.named_graphs()[{name!r}]"
            )
            return
        ns[name] = graph

    def _graph(self, name: str | None, magic: Callable[..., Any]) -> tuple[Graph, str]:
        """The graph ``name`` (``None``: the default graph) and how to call it in a message."""
        if name is None:
            return get_default_graph(), "the default graph"
        if name not in self.ext.graphs:
            known = ", ".join(sorted(self.ext.graphs)) or "none yet"
            raise usage_error(magic, f"no graph named {name!r}; named graphs: {known} (a %%graph NAME cell makes one)")
        return self.ext.graphs[name], f"graph {name!r}"

    def _run(self, cell: str, line: str = "") -> None:
        """Run ``cell`` (of a ``%%graph line`` magic) in the notebook's namespace as IPython would, displaying its
        last expression's value."""
        __tracebackhide__ = True
        shell = self.shell
        assert shell is not None
        # The leading newline keeps line numbers those of the cell, whose line 1 is "%%graph": nodes record them.
        code = "\n" + shell.transform_cell(cell)
        # Registered with IPython, the code's lines show in tracebacks as "Cell In[n], line k" (line 1 as the
        # user wrote it).
        magic_line = f"%%graph {line}".rstrip()
        filename = shell.compile.cache(code, self.ext.tracker.cell_number(), raw_code=f"{magic_line}\n{cell}")
        tree = ast.parse(code, filename=filename)
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        flags, ns = shell.compile.flags, shell.user_ns
        # Running the user's own cell is the point of the magic.
        exec(compile(tree, filename, "exec", flags=flags, dont_inherit=True), shell.user_global_ns, ns)  # noqa: S102
        if last is not None:
            code_object = compile(ast.Expression(last.value), filename, "eval", flags=flags, dont_inherit=True)
            value = eval(code_object, shell.user_global_ns, ns)  # noqa: S307
            if value is not None:
                show(value)

    @magic_arguments()
    @kwds(formatter_class=MagicFormatter)
    @argument("-h", "--help", action="store_true", help="show this help and do nothing")
    @argument("--strategy", choices=sorted(STRATEGIES), default="greedy", help="how variables spread over the PS tasks")
    @argument("name", nargs="?", metavar="GRAPH", help="a graph made by %%%%graph GRAPH (default: the default graph)")
    @line_magic
    def placement(self, line: str) -> None:
        """Place GRAPH on the current cluster's devices: show it coloured by device, and a table of node, op,
        device and the reason for each.

        Needs a cluster: %cluster up, or %cluster connect ADDRESS.
        """
        args = parse(self.placement, line)
        if args is None:
            return
        graph, what = self._graph(args.name, self.placement)
        if len(graph) == 0:
            named = sorted(name for name, g in self.ext.graphs.items() if len(g))
            if args.name is None and named:  # the cells built into %%graph NAME, not into the default graph
                raise usage_error(
                    self.placement,
                    f"the default graph has no nodes: your cells built into the named graph(s) {', '.join(named)}; "
                    f"name one, e.g. %placement {named[0]}",
                )
            raise usage_error(self.placement, f"{what} has no nodes yet: build it in a cell first")
        job = self._running_job(graph)
        if job is not None:
            # The graph a running job trains: draw what its replicas and parameter servers run, not a new placement.
            print(f"%placement: {what} is training as job {job.job_id}: its step graph as placed and running")
            show_as("graph_view", "GraphView", job.step_graph, placement=job.placement)
            show(PlacementTable(job.placement))
            return
        cluster = self.ext.current_cluster()
        if cluster is None:
            raise UsageError(f"%placement: {NO_CLUSTER}")  # the arguments are fine: no usage
        devices = ask_cluster("%placement", cluster, cluster.devices)
        if cluster.ps_placement == "colocated":
            # A colocated job runs a shard in each training worker: a ps task each, as cg.train places them.
            shards = len(ask_cluster("%placement", cluster, cluster.training_workers))
            devices = [f"/job:ps/task:{i}/device:cpu:0" for i in range(shards)] + devices
        try:
            placement = place(graph, devices, strategy=args.strategy)
        except CellgraphError as err:  # a PlacementError
            raise UsageError(f"%placement: could not place {what}: {err}") from None
        show_as("graph_view", "GraphView", graph, placement=placement)
        show(PlacementTable(placement))

    def _running_job(self, graph: Graph) -> Job | None:
        """The newest running job that trains a loss of ``graph`` and has placed its step, if any."""
        for job in reversed(self.ext.jobs):
            if job.loss.graph is graph and job.status in ("starting", "running"):
                try:
                    job.placement  # noqa: B018 - raises while the job is still starting
                except CellgraphError:
                    continue
                return job
        return None


_UNSET = object()  # NAME was not bound in the notebook


def _labelled(name: str) -> Graph:
    """A new graph for ``%%graph NAME``: its messages call it by NAME."""
    graph = Graph()
    graph.label = name
    return graph
