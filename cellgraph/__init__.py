"""cellgraph: distributed machine learning from a notebook.

``import cellgraph as cg`` gives the whole public API: graphs and sessions,
every op as ``cg.<op name>``, ``cg.layers``, ``cg.losses``, ``cg.optim`` and
``cg.init``.
"""

from __future__ import annotations

from cellgraph.dataflow import (
    CellgraphWarning,
    Graph,
    Node,
    Session,
    Tensor,
    TensorSpec,
    cell_scope,
    colocate_with,
    control_dependencies,
    device,
    from_graphdef,
    errors,
    get_default_graph,
    get_num_threads,
    gradients,
    name_scope,
    reset_default_graph,
    set_num_threads,
    to_graphdef,
)
from cellgraph.dataflow.errors import (
    CellgraphError,
    DTypeError,
    ExecutionError,
    GradientError,
    GraphError,
    KernelNotFound,
    RegistryError,
    ShapeError,
    StaleNodeError,
)
from cellgraph.dataflow.ops import FAMILIES as _FAMILIES

# Every public op function, from every family, as cg.<name>.
for _family in _FAMILIES:
    for _name in getattr(_family, "__all__", ()):
        globals()[_name] = getattr(_family, _name)

__version__ = "0.1.0"

# The conveniences over the ops; imported last, they use the names above.
from cellgraph import init, layers, losses, metrics, optim  # noqa: E402
