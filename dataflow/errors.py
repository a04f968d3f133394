"""The errors cellgraph raises.

Every message names what failed and where: the op type, the node name, the
cell and line that created it, and every shape involved. Tests assert the
words, so a message is part of the interface.
"""

from __future__ import annotations


class CellgraphError(Exception):
    """Base class of every error cellgraph raises on purpose."""


class RegistryError(CellgraphError, LookupError):
    """A duplicate registration, or a lookup of a name nobody registered."""


class ShapeError(CellgraphError, ValueError):
    """Shapes that do not fit together, found when a node is built or fed."""


class DTypeError(CellgraphError, TypeError):
    """A dtype that the op (or the feed) does not accept."""


class KernelNotFound(CellgraphError, LookupError):
    """No kernel for an op on the requested device."""


class GraphError(CellgraphError, ValueError):
    """Misuse of a graph: a foreign tensor, a missing feed, a bad fetch."""


class StaleNodeError(GraphError):
    """A node whose inputs were replaced by re-running a cell, and that no longer fits."""


class GradientError(CellgraphError):
    """A gradient rule that is missing, or that returned the wrong shape or dtype."""


class ExecutionError(CellgraphError, RuntimeError):
    """A kernel failed while a graph ran; the message names the node."""


class PlacementError(CellgraphError, ValueError):
    """A malformed device name, or a node that cannot go where it was asked to."""
