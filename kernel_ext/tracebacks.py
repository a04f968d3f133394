"""A cellgraph error or warning in a notebook shows the user's own lines, not cellgraph's insides or files.

A ``ShapeError`` from an op's shape rule, or a missing feed found by the
session, came with 35 to 50 frames of cellgraph's own code above its one line
of news, which already names the node, its cell and line, and every shape
involved. With the extension loaded, a ``CellgraphError`` is shown with the
frames of the user's cells (and of any other library) only, and so is a
``ValueError`` or ``TypeError`` that cellgraph raised itself to refuse an
argument (``cg.optim.Nadam(-1e-3)``, an unknown ``cg.layers.policy``), or a
``KeyboardInterrupt`` it words itself (``job.wait()`` interrupted): a
``raise`` statement of cellgraph's code is the innermost frame. ``%xmode
Verbose`` shows cellgraph's frames too, as does any other error (one from
inside cellgraph that no ``raise`` of its own made is a bug to report whole). The
error a kernel raised inside a run (a label out of range) is not shown a
second time, with the kernel's and the generated plan's frames, under the
``ExecutionError`` whose message already names it and the op. A
``CellgraphWarning`` located at a cell reads ``Cell In[7], line 2:``, as
IPython names a cell in a traceback, not by the temporary file ipykernel
compiled the cell into (``/tmp/ipykernel_1234/56789.py:2:``).

Examples
--------
>>> import cellgraph as cg
>>> def build():
...     g = cg.Graph()
...     with g.as_default():
...         cg.matmul(cg.placeholder((None, 3)), cg.placeholder((4, 2)))
>>> try:
...     build()
... except cg.ShapeError as err:
...     tb = err.__traceback__
>>> [t.tb_frame.f_code.co_name for t in frames(user_frames(tb))]
['<module>', 'build']
"""

from __future__ import annotations

import difflib
import importlib.util
import linecache
import os
import re
import types
import warnings
from collections.abc import Callable, Iterator
from functools import lru_cache
from typing import Any

from IPython.core.error import UsageError

from cellgraph.dataflow.cells import CellgraphWarning
from cellgraph.dataflow.errors import CellgraphError

# The handler sees these; a ValueError or TypeError that cellgraph did not raise itself is shown as IPython would.
# IPython's UsageError too: a misspelt magic's ("Line magic function `%trian` not found.") is told the one meant.
# A KeyboardInterrupt that cellgraph words itself (job.wait() interrupted: the job goes on) is its word too.
ERRORS = (CellgraphError, ValueError, TypeError, UsageError, KeyboardInterrupt)
_NOT_FOUND = re.compile(r"(?:Line magic function `%|Cell magic `%%)(?P<name>[^`]+)` not found")


@lru_cache(maxsize=1)
def _package_dirs() -> tuple[str, ...]:
    """Where cellgraph's code lives: its package and the subpackages an editable install keeps apart."""
    dirs = set()
    for name in ("cellgraph", "cellgraph.dataflow", "cellgraph.cluster", "cellgraph.widgets", "cellgraph.kernel_ext"):
        spec = importlib.util.find_spec(name)  # the parent package only: cluster's Dask is not imported
        for location in (spec.submodule_search_locations or []) if spec is not None else []:
            dirs.add(os.path.join(os.path.realpath(location), ""))
    return tuple(sorted(dirs))


def _inside_cellgraph(filename: str) -> bool:
    # "<cellgraph plan 3>": the straight-line code the executor generates for a plan.
    return filename.startswith("<cellgraph") or os.path.realpath(filename).startswith(_package_dirs())


def frames(tb: types.TracebackType | None) -> Iterator[types.TracebackType]:
    """The entries of traceback ``tb``, outermost first."""
    while tb is not None:
        yield tb
        tb = tb.tb_next


def user_frames(
    tb: types.TracebackType | None, is_cell: Callable[[str], bool] | None = None
) -> types.TracebackType | None:
    """``tb`` without cellgraph's own frames; ``tb`` itself when nothing else is left (an error inside
    cellgraph with no caller of the user's). With ``is_cell`` (whether a file is a notebook cell's), a cell's
    line as IPython rewrote it to call its cell magic goes too when a cell's own frame follows (a ``%%graph``
    cell's code): it would show the whole cell again, squeezed onto one line."""
    entries = list(frames(tb))
    inside = [_inside_cellgraph(t.tb_frame.f_code.co_filename) for t in entries]
    # contextlib's __enter__ between a cell's `with cg.layers.policy(...)` and cellgraph's generator is glue too.
    glue = [
        os.path.basename(t.tb_frame.f_code.co_filename) == "contextlib.py" and i + 1 < len(inside) and inside[i + 1]
        for i, t in enumerate(entries)
    ]
    kept = [t for t, own, joins in zip(entries, inside, glue) if not (own or joins)]
    if not kept:
        return tb
    if is_cell is not None:
        cells = [i for i, t in enumerate(kept) if is_cell(t.tb_frame.f_code.co_filename)]
        kept = [t for i, t in enumerate(kept) if not (_calls_a_cell_magic(t) and any(c > i for c in cells))]
    chain = None
    for t in reversed(kept):
        chain = types.TracebackType(chain, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return chain


def _calls_a_cell_magic(entry: types.TracebackType) -> bool:
    """Whether ``entry`` is a cell's line as IPython rewrote it to call its cell magic."""
    line = linecache.getline(entry.tb_frame.f_code.co_filename, entry.tb_lineno)
    return line.lstrip().startswith("get_ipython().run_cell_magic(")


def show(shell: Any, etype: type[BaseException], value: BaseException, tb: Any, tb_offset: Any = None) -> None:
    """IPython's custom exception handler for ``ERRORS`` (``set_custom_exc``): the traceback as IPython shows
    it, less cellgraph's frames unless ``%xmode Verbose`` is on."""
    if isinstance(value, UsageError) and (meant := _meant_magic(shell, str(value))):
        value = UsageError(f"{value} Did you mean {meant}?")
    if getattr(shell.InteractiveTB, "mode", "") == "Verbose" or not _cellgraphs(value, tb):
        shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
        return
    cells = getattr(getattr(shell, "compile", None), "_filename_map", {})
    tb = user_frames(tb, cells.__contains__)
    chained = _told_cause(value)
    if chained is None:
        shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
        return
    # Shown without it, then given back: %debug and sys.last_value still find the cause.
    cause, suppress = value.__cause__, value.__suppress_context__
    value.__cause__, value.__suppress_context__ = None, True
    try:
        shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
    finally:
        value.__cause__, value.__suppress_context__ = cause, suppress


def _meant_magic(shell: Any, message: str) -> str | None:
    """The magics a misspelt one in IPython's "not found" ``message`` may have meant (``%train``), or None."""
    found = _NOT_FOUND.search(message)
    if found is None:
        return None
    kind, prefix = ("line", "%") if message.startswith("Line") else ("cell", "%%")
    known = list(getattr(getattr(shell, "magics_manager", None), "magics", {}).get(kind, {}))
    close = difflib.get_close_matches(found["name"], known, n=2)
    return " or ".join(prefix + name for name in close) or None


def _cellgraphs(value: BaseException, tb: types.TracebackType | None) -> bool:
    """Whether ``value`` is cellgraph's word to the user: a ``CellgraphError``, or an error a ``raise`` statement of
    cellgraph's own code made (its innermost frame), as an argument check does."""
    if isinstance(value, CellgraphError):
        return True
    last = next(iter(reversed(list(frames(tb)))), None)
    if last is None or not _inside_cellgraph(last.tb_frame.f_code.co_filename):
        return False
    return linecache.getline(last.tb_frame.f_code.co_filename, last.tb_lineno).lstrip().startswith("raise ")


def _told_cause(value: BaseException) -> BaseException | None:
    """The exception ``value`` was raised from (or during), when it happened inside cellgraph and ``value``'s
    message already says it ('... failed while running: ValueError: label 6 ...'): a second traceback of
    cellgraph's kernel and generated plan would only repeat it. None when there is none, or it is news."""
    chained = value.__cause__ or (None if value.__suppress_context__ else value.__context__)
    if chained is None or str(chained) not in str(value):
        return None
    if any(not _inside_cellgraph(t.tb_frame.f_code.co_filename) for t in frames(chained.__traceback__)):
        return None
    return chained


class WarningFormat:
    """``warnings.formatwarning`` while the extension is loaded: a ``CellgraphWarning`` at a cell names the cell
    as a traceback does; every other warning is formatted as before."""

    def __init__(self, shell: Any, previous: Callable[..., str]) -> None:
        self.shell = shell
        self.previous = previous

    def __call__(
        self, message: Warning | str, category: type[Warning], filename: str, lineno: int, line: str | None = None
    ) -> str:
        cells = getattr(getattr(self.shell, "compile", None), "_filename_map", {})
        if not (isinstance(category, type) and issubclass(category, CellgraphWarning) and filename in cells):
            return self.previous(message, category, filename, lineno, line)
        source = (line if line is not None else linecache.getline(filename, lineno)).strip()
        text = f"Cell In[{cells[filename]}], line {lineno}: {category.__name__}: {message}\n"
        return text + (f"  {source}\n" if source else "")

    def install(self) -> None:
        warnings.formatwarning = self

    def uninstall(self) -> None:
        if warnings.formatwarning is self:  # another one set later stays
            warnings.formatwarning = self.previous


__all__ = ["ERRORS", "WarningFormat", "frames", "show", "user_frames"]
