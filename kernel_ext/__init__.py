"""The IPython extension: ``%load_ext cellgraph``, cell tracking, magics and the kernelspec.

Loading it (``%load_ext cellgraph``, or a kernel installed by ``cellgraph
install-kernel``) runs every cell inside a cell scope, so that re-running a cell
replaces its nodes, and adds the magics ``%%graph``, ``%cluster``,
``%placement`` and ``%train``; each takes ``--help``.

IPython is imported when the extension loads, not with this package: the
command line reads ``kernelspec`` from here and should stay quick.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cellgraph.dataflow.graph import Graph

__all__ = ["load_ipython_extension", "named_graphs", "unload_ipython_extension"]


def load_ipython_extension(ipython: Any) -> None:
    """Register the magics and the cell tracker (``%load_ext cellgraph``); loading twice does nothing more."""
    from .extension import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    """Take the magics and the cell tracker away (``%unload_ext cellgraph``); graphs, cluster and jobs stay."""
    from .extension import unload_ipython_extension as unload

    unload(ipython)


def named_graphs(shell: Any = None) -> dict[str, Graph]:
    """The graphs ``%%graph NAME`` cells built, by name (of ``shell``, default: the running one).

    Examples
    --------
    >>> from cellgraph.kernel_ext import named_graphs  # doctest: +SKIP
    >>> encoder = named_graphs()["encoder"]  # doctest: +SKIP
    """
    from .extension import named_graphs as graphs

    return graphs(shell)
