"""The dataflow core: graph IR, op registry, autodiff, optimizers and executor."""

from __future__ import annotations

from . import ops  # registers every op
from .autodiff import gradients
from .cells import CellgraphWarning, cell_scope
from .graph import (
    Graph,
    Node,
    Tensor,
    colocate_with,
    control_dependencies,
    device,
    get_default_graph,
    name_scope,
    reset_default_graph,
)
from .graphdef import from_graphdef, to_graphdef
from .opdef import OPS, OpDef, TensorSpec, not_differentiable
from .partition import partition
from .partitioned_session import PartitionedSession
from .session import Session
from .threads import get_num_threads, set_num_threads
from .transport import InProcessTransport, Transport

__all__ = [
    "OPS",
    "CellgraphWarning",
    "Graph",
    "Node",
    "InProcessTransport",
    "OpDef",
    "PartitionedSession",
    "Session",
    "Tensor",
    "TensorSpec",
    "cell_scope",
    "colocate_with",
    "control_dependencies",
    "device",
    "from_graphdef",
    "get_default_graph",
    "get_num_threads",
    "gradients",
    "name_scope",
    "not_differentiable",
    "ops",
    "partition",
    "reset_default_graph",
    "set_num_threads",
    "to_graphdef",
    "Transport",
]
