"""A real IPython shell with ``%load_ext cellgraph`` done, and running cells in it as a notebook would."""

from __future__ import annotations

import atexit
import sys
import uuid
from collections.abc import Iterator

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import ExecutionResult, InteractiveShell
from traitlets.config import Config

import cellgraph as cg
from cellgraph.kernel_ext import unload_ipython_extension


def new_shell() -> Iterator[InteractiveShell]:
    """An InteractiveShell (the process's instance, so that ``display`` reaches it) with the extension loaded.

    The shell takes ``sys.modules["__main__"]`` for its namespace and the
    extension works on the default graph: both are put back afterwards.
    """
    main = sys.modules["__main__"]
    InteractiveShell.clear_instance()
    config = Config()
    config.HistoryManager.enabled = False  # no history database, no writer thread
    config.InteractiveShell.colors = "nocolor"
    shell = InteractiveShell.instance(config=config)
    cg.reset_default_graph()
    try:
        ok(shell, "%load_ext cellgraph")
        yield shell
    finally:
        unload_ipython_extension(shell)
        shell.reset(new_session=False)
        # Each shell registers its reset for the process's exit, where it would run again for every shell the
        # tests made, each a full garbage collection of the whole session's heap: 2 minutes at the end of CI.
        atexit.unregister(shell.atexit_operations)
        InteractiveShell.clear_instance()
        sys.modules["__main__"] = main
        cg.reset_default_graph()


NEW = "new"  # run()'s default: a new cell id for each cell, as a notebook gives each new cell


def run(shell: InteractiveShell, source: str, cell_id: str | None = NEW) -> ExecutionResult:
    """Run ``source`` as a notebook cell (counted, as ``In [n]``) with the cell id a front end would send.

    ``cell_id=None`` sends none, as the IPython terminal does.
    """
    if cell_id is NEW:
        cell_id = uuid.uuid4().hex
    return shell.run_cell(source, store_history=True, cell_id=cell_id)


def ok(shell: InteractiveShell, source: str, cell_id: str | None = NEW) -> ExecutionResult:
    """Run a cell that must succeed."""
    result = run(shell, source, cell_id)
    assert result.success, f"cell failed: {result.error_before_exec or result.error_in_exec!r}\n{source}"
    return result


def refused(shell: InteractiveShell, capsys: pytest.CaptureFixture[str], source: str) -> str:
    """Run a magic that must refuse its arguments: a UsageError, printed without a traceback; return what it printed."""
    capsys.readouterr()
    result = run(shell, source)
    assert isinstance(result.error_in_exec, UsageError), f"{source!r} gave {result.error_in_exec!r}"
    err = capsys.readouterr().err
    assert err.startswith("UsageError: ") and "Traceback" not in err, err
    return err


def names(graph: cg.Graph) -> list[str]:
    return [node.name for node in graph.nodes]
