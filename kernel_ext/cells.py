"""Cell tracking: each notebook cell runs inside ``cg.cell_scope``, so re-running it replaces its nodes.

IPython's ``pre_run_cell`` event opens the scope (on the default graph, and on
every named graph that holds nodes of the same cell; a graph the cell's own
code enters with ``with g.as_default():`` joins it there) and ``post_run_cell``
closes it, passing on the cell's error so that a cell that raises leaves every
graph as it was. JupyterLab, Notebook 7 and VS Code send a cell id with each
execution; a front end that sends none (the IPython terminal) gets the cell's
source as its id instead, and is told so once (on stderr).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import IPython

from cellgraph.dataflow import graph as graph_module
from cellgraph.dataflow.cells import CellgraphWarning, CellRun, cell_scope
from cellgraph.dataflow.graph import Graph, Tensor, add_graph_hook, get_default_graph

# What to subtract from shell.execution_count during a cell to get its ``In [n]``: the IPython 9 here counts a
# cell before it sends pre_run_cell, IPython 8 afterwards. A first guess: post_run_cell checks it on every cell.
_FIRST_GUESS_OFFSET = 1 if IPython.version_info[0] >= 9 else 0

NO_CELL_IDS = (
    "cellgraph: this front end sends no cell ids (JupyterLab, Notebook 7 and VS Code do), so a cell is known "
    "by its source: re-running the same source replaces its nodes, but an edited cell adds new ones next to "
    "the old. Start a new graph with cg.reset_default_graph(), or use a front end that sends cell ids"
)


@dataclass
class ActiveCell:
    """The cell that runs now: its id, its label (``[n]``), and the cell scope open on each graph."""

    info: Any  # IPython's ExecutionInfo: post_run_cell hands the same object back
    cell_id: str
    label: str | None
    scopes: list[tuple[Graph, AbstractContextManager[CellRun]]] = field(default_factory=list)
    runs: list[CellRun] = field(default_factory=list)
    thread: int = field(default_factory=threading.get_ident)  # the thread that runs the cell's code
    entered: list[Graph] = field(default_factory=list)  # graphs the cell's code made the default
    started: float = field(default_factory=time.monotonic)

    def join(self, graph: Graph) -> None:
        """Open this cell's scope on ``graph`` too (no-op if it is open there already)."""
        if any(g is graph for g, _ in self.scopes):
            return
        scope = cell_scope(self.cell_id, self.label, graph)
        self.runs.append(scope.__enter__())
        self.scopes.append((graph, scope))

    def relabel(self, label: str) -> None:
        """Call the cell ``label`` from now on, in the nodes it made so far too."""
        self.label = label
        for run in self.runs:
            run.label = label
            for node in run.new:
                node.cell_label = label


class CellTracker:
    """Opens a cell scope when a cell starts and closes it, committing or rolling back, when it ends."""

    def __init__(
        self,
        shell: Any,
        named_graphs: Callable[[], Iterable[Graph]],
        running_jobs: Callable[[], Iterable[RunningJob]] = tuple,
    ) -> None:
        self.shell = shell
        self._named_graphs = named_graphs
        self._running_jobs = running_jobs
        self.active: ActiveCell | None = None
        self._told_no_cell_ids = False
        self._count_offset = _FIRST_GUESS_OFFSET
        self._remove_hook: Callable[[], None] | None = None
        # Graphs a cell built into through ``as_default``: a re-run that no longer builds there takes its nodes away.
        self._joined: weakref.WeakSet[Graph] = weakref.WeakSet()

    def cell_number(self) -> int:
        """The ``n`` of ``In [n]`` for the cell that runs now (while it runs)."""
        return int(self.shell.execution_count) - self._count_offset

    def register(self) -> None:
        self.shell.events.register("pre_run_cell", self.pre_run_cell)
        self.shell.events.register("post_run_cell", self.post_run_cell)
        self._remove_hook = add_graph_hook(self.on_graph)

    def on_graph(self, graph: Graph, event: str) -> None:
        """A graph the running cell's own code entered (``with g.as_default():``) becomes one of the cell's graphs
        once the cell adds a node to it (not before: the cell may open a ``cg.cell_scope`` of its own there), so
        that re-running the cell replaces what it built there instead of adding ``dense_1`` (TF1's trap), and what
        a re-run makes stale names this cell. Graphs entered by cellgraph itself (a job's step graph, a loaded
        model) or on another thread are left alone."""
        active = self.active
        if active is None or active.thread != threading.get_ident() or graph._cell_run is not None:
            return
        if event == "as_default":
            if not any(g is graph for g in active.entered) and self._called_from_cell():
                active.entered.append(graph)
        elif any(g is graph for g in active.entered):
            active.join(graph)
            self._joined.add(graph)

    def _called_from_cell(self) -> bool:
        """Whether the code that entered ``as_default`` is a cell's own (a file IPython compiled for a cell)."""
        cells = getattr(getattr(self.shell, "compile", None), "_filename_map", {})
        frame = sys._getframe(2)
        while frame is not None:
            filename = frame.f_code.co_filename
            if filename != graph_module.__file__ and os.path.basename(filename) != "contextlib.py":
                return filename in cells
            frame = frame.f_back  # type: ignore[assignment]
        return False

    def unregister(self) -> None:
        """Stop tracking; a cell running now (``%unload_ext cellgraph`` itself) keeps what it made so far."""
        if self._remove_hook is not None:
            self._remove_hook()
            self._remove_hook = None
        for event, callback in (("pre_run_cell", self.pre_run_cell), ("post_run_cell", self.post_run_cell)):
            with contextlib.suppress(ValueError):  # not registered: unregistering twice is harmless
                self.shell.events.unregister(event, callback)
        if self.active is not None:
            self._close(None)

    def pre_run_cell(self, info: Any) -> None:
        if self.active is not None:
            # A cell run from inside a cell (``%%capture`` does that): its nodes belong to the outer cell.
            return
        cell_id = getattr(info, "cell_id", None)
        if not cell_id:
            cell_id = "source-" + hashlib.sha1(info.raw_cell.encode(), usedforsecurity=False).hexdigest()[:12]
            if not self._told_no_cell_ids:
                self._told_no_cell_ids = True
                print(NO_CELL_IDS, file=sys.stderr)
        label = f"[{self.cell_number()}]" if info.store_history else None
        active = ActiveCell(info, str(cell_id), label)
        # The default graph, and every named graph this cell built into last time: an edited cell that now
        # builds elsewhere must take its old nodes away from there too.
        graphs = [get_default_graph()]
        others = [*self._named_graphs(), *self._joined]
        for graph in others:
            if active.cell_id in graph.cells and not any(g is graph for g in graphs):
                graphs.append(graph)
        try:
            for graph in graphs:
                active.join(graph)
        except BaseException as err:
            _close_scopes(active, err)
            raise
        self.active = active

    def post_run_cell(self, result: Any) -> None:
        active = self.active
        if active is None:
            return
        if result is None:  # IPython failed before it had a result: the cell did not finish
            self._close(RuntimeError("the cell did not finish"))
            return
        if result.info is not active.info:
            return  # a cell run from inside the active one, or an empty cell (no pre_run_cell)
        number = result.execution_count
        if active.label is not None and number is not None and active.label != f"[{number}]":
            # This IPython counts cells at another moment than guessed: learn it, and put this cell's labels right.
            self._count_offset += int(active.label[1:-1]) - number
            active.relabel(f"[{number}]")
        self._close(result.error_before_exec or result.error_in_exec)

    def _close(self, error: BaseException | None) -> None:
        active, self.active = self.active, None
        if active is not None:
            _close_scopes(active, error, self.shell)
            if error is None:  # a cell that raised was rolled back: the graphs are as the jobs and views found them
                views = sys.modules.get("cellgraph.widgets.graph_view")  # not imported: no view was ever made
                for run in active.runs:
                    if run.old and views is not None:
                        views.mark_views_stale(run.graph, run.label, active.started)
                for job in self._running_jobs():
                    note = job_note(active, job)
                    if note is not None:
                        warnings.warn_explicit(note, CellgraphWarning, *_cell_location(active, self.shell))


def _close_scopes(active: ActiveCell, error: BaseException | None, shell: Any = None) -> None:
    """Commit (no error) or roll back every scope of ``active``, last opened first, even if one fails.

    What the commits warn about is said once, as one warning located at the
    user's cell (see ``_warn_at_cell``), not once per variable at this file.
    """
    exc_info: tuple[type[BaseException] | None, BaseException | None, TracebackType | None] = (None, None, None)
    if error is not None:
        exc_info = (type(error), error, error.__traceback__)
    failures = []
    with warnings.catch_warnings(record=True) as caught:
        # Python's default filter shows a warning once per place and text; a re-run cell must say again
        # what it made stale, so every note is caught here and said anew below.
        warnings.simplefilter("always", CellgraphWarning)
        for _, scope in reversed(active.scopes):
            try:
                scope.__exit__(*exc_info)
            except Exception as err:  # every scope must close, whatever the others do
                failures.append(err)
    notes = [str(w.message) for w in caught if issubclass(w.category, CellgraphWarning)]
    for other in (w for w in caught if not issubclass(w.category, CellgraphWarning)):
        warnings.warn_explicit(other.message, other.category, other.filename, other.lineno)
    if notes:
        _warn_at_cell(active, notes, shell)
    if failures:
        raise failures[0]


# A commit's note on a variable whose shape changed, as cellgraph.dataflow.cells words it.
_RESIZED = re.compile(r"variable '(?P<name>.+)' \(cell [^)]*\) changed from (?P<change>.+); it is re-initialised")
# ... and on one whose initial value changed (its shape and dtype did not).
_RESTARTED = re.compile(
    r"variable '(?P<name>.+)' \(cell [^)]*\) has a new initial value; it is re-initialised, and its optimizer slots with it"
)


def summary(label: str, notes: list[str]) -> str:
    """One sentence for all of a re-run cell's notes: the variables re-initialised (their optimizer slots counted,
    not listed), then what it made stale."""
    resized = [m for m in map(_RESIZED.fullmatch, notes) if m is not None]
    names = {m["name"] for m in resized}
    # An optimizer's slot is named "<optimizer>/<variable>/<slot>": say how many, not each one.
    slots = [m for m in resized if any(m["name"].rsplit("/", 1)[0].endswith("/" + n) for n in names)]
    variables = [m for m in resized if m not in slots]
    parts = []
    if variables:
        listed = ", ".join(f"{m['name']!r} {m['change']}" for m in variables)
        parts.append(
            f"re-initialised {len(variables)} variable(s) whose shape changed: {listed}"
            + (f" (and {len(slots)} optimizer slot(s) of them)" if slots else "")
        )
    restarted = [m["name"] for m in map(_RESTARTED.fullmatch, notes) if m is not None]
    if restarted:
        listed = ", ".join(repr(name) for name in restarted)
        parts.append(
            f"re-initialised {len(restarted)} variable(s) whose initial value changed, and their optimizer slots: {listed}"
        )
    prefix = f"re-running cell {label} "
    parts += [
        note.removeprefix(prefix)
        for note in notes
        if _RESIZED.fullmatch(note) is None and _RESTARTED.fullmatch(note) is None
    ]
    return prefix + "; it ".join(parts)


def _label(active: ActiveCell) -> str:
    return active.runs[0].label if active.runs else str(active.label or active.cell_id)


def _cell_location(active: ActiveCell, shell: Any) -> tuple[str, int]:
    """Where a warning about ``active`` is located: the file IPython compiled the cell into, line 1."""
    number = int(active.label[1:-1]) if active.label else None
    filename = f"Cell In{active.label}" if active.label else f"cell {active.cell_id}"
    # IPython files each cell's code under a name (a temporary .py in ipykernel) that linecache can read,
    # so the warning shows the line too; a %%graph cell's own compile comes last and keeps the cell's lines.
    names = getattr(getattr(shell, "compile", None), "_filename_map", {})
    matching = [name for name, n in names.items() if n == number]
    if matching:
        filename = matching[-1]
    return filename, 1


def _warn_at_cell(active: ActiveCell, notes: list[str], shell: Any) -> None:
    """Say ``notes`` as one ``CellgraphWarning`` at the cell's own code (its first line, or the first resized
    variable's), as a warning from the user's code would show, not at this extension's file."""
    filename, first = _cell_location(active, shell)
    resized = {m["name"] for m in map(_RESIZED.fullmatch, notes) if m is not None}
    lines = [node.line for run in active.runs for node in run.new if node.name in resized and node.line]
    warnings.warn_explicit(summary(_label(active), notes), CellgraphWarning, filename, min(lines, default=first))


@dataclass
class RunningJob:
    """A job still starting or running, as the cell tracker needs it: its loss, and how the notebook names it."""

    job_id: str
    status: str
    loss: Tensor
    variable: str | None  # the notebook's name for it (``job``), if one is bound to it
    magic: bool  # started by %train (else by cg.train)


def job_note(active: ActiveCell, job: RunningJob) -> str | None:
    """What to say when the cell that just ran replaced nodes that ``job``'s loss is built from: the job keeps
    training the graph it was given (its step was serialized at its start), and the new graph needs a new job.

    ``None`` when the cell left the job's nodes alone, or made the job's loss itself (a job it started).
    """
    graph, node = job.loss.graph, job.loss.node
    runs = [run for run in active.runs if run.graph is graph]
    if any(made is node for run in runs for made in run.new):
        return None
    replaced = {name for run in runs for name in run.old}
    if not replaced:
        return None
    # Everything the loss is built from, by name: a re-run's new nodes keep the old ones' names, and the loss
    # (re-bound to them, or itself replaced) still reaches each name its step holds.
    seen: set[str] = set()
    todo = [node]
    while todo:
        current = todo.pop()
        if current.name in seen:
            continue
        seen.add(current.name)
        todo += [t.node for t in current.inputs] + list(current.control_inputs)
    changed = sorted(replaced & seen)
    if not changed:
        return None
    listed = ", ".join(repr(name) for name in changed[:3]) + (", ..." if len(changed) > 3 else "")
    handle = job.variable or "the job"
    again = "%train" if job.magic else "cg.train(...)"
    return (
        f"re-running cell {_label(active)} changed {len(changed)} node(s) that the {job.status} job {job.job_id} "
        f"trains ({listed}); the job keeps training the graph as it was when it started. To train the new "
        f"graph: {handle}.stop(), then {again} again"
    )
