"""cellgraph: distributed machine learning from a notebook.

``import cellgraph as cg`` gives the whole public API: graphs and sessions,
every op as ``cg.<op name>``, ``cg.layers``, ``cg.losses``, ``cg.optim``,
``cg.metrics`` and ``cg.init``.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable

from cellgraph.dataflow import (
    CellgraphWarning,
    Graph,
    InProcessTransport,
    Node,
    PartitionedSession,
    Session,
    Tensor,
    TensorSpec,
    Transport,
    cell_scope,
    colocate_with,
    control_dependencies,
    device,
    errors,
    from_graphdef,
    get_default_graph,
    get_num_threads,
    gradients,
    name_scope,
    partition,
    placement,
    reset_default_graph,
    set_num_threads,
    to_graphdef,
)
from cellgraph.dataflow import display as _display
from cellgraph.dataflow.devices import DeviceSpec
from cellgraph.dataflow.errors import (
    CellgraphError,
    DTypeError,
    ExecutionError,
    GradientError,
    GraphError,
    KernelNotFound,
    PlacementError,
    RegistryError,
    ShapeError,
    StaleNodeError,
)
from cellgraph.dataflow.ops.activations import (
    elu,
    gelu,
    hard_sigmoid,
    leaky_relu,
    relu6,
    selu,
    silu,
    softplus,
    softsign,
    swish,
)
from cellgraph.dataflow.ops.array import (
    concat,
    expand_dims,
    reshape,
    squeeze,
    transpose,
)
from cellgraph.dataflow.ops.array_gather import gather, one_hot
from cellgraph.dataflow.ops.array_index import gather_nd, scatter_nd, tensor_scatter_nd_max, tensor_scatter_nd_min
from cellgraph.dataflow.ops.array_more import (
    broadcast_to,
    depth_to_space,
    reverse,
    space_to_depth,
    split,
    stack,
    tile,
    unstack,
)
from cellgraph.dataflow.ops.array_shape import range, shape, size
from cellgraph.dataflow.ops.array_slice import getitem, pad, slice
from cellgraph.dataflow.ops.conv import (
    avg_pool,
    conv2d,
    conv2d_backprop_filter,
    conv2d_backprop_input,
    max_pool,
)
from cellgraph.dataflow.ops.conv_more import conv1d, conv2d_transpose, depthwise_conv2d, max_pool_with_argmax
from cellgraph.dataflow.ops.cumulative import cumprod, cumsum
from cellgraph.dataflow.ops.einsum import einsum
from cellgraph.dataflow.ops.logic import (
    greater,
    is_finite,
    is_nan,
    logical_and,
    logical_not,
    logical_or,
    logical_xor,
    not_equal,
)
from cellgraph.dataflow.ops.math import (
    add,
    cast,
    div,
    equal,
    exp,
    greater_equal,
    less,
    less_equal,
    log,
    matmul,
    maximum,
    minimum,
    mul,
    neg,
    ones_like,
    pow,
    reduce_max,
    reduce_mean,
    reduce_sum,
    sqrt,
    square,
    sub,
    zeros_like,
)
from cellgraph.dataflow.ops.math_unary import (
    abs,
    ceil,
    clip_by_value,
    cos,
    erf,
    expm1,
    floor,
    floordiv,
    floormod,
    log1p,
    mod,
    round,
    rsqrt,
    sign,
    sin,
    stop_gradient,
    tan,
    where,
)
from cellgraph.dataflow.ops.nn import (
    bias_add,
    dropout,
    log_softmax,
    relu,
    sigmoid,
    softmax,
    sparse_softmax_cross_entropy,
    tanh,
)
from cellgraph.dataflow.ops.normalization import batch_norm, layer_norm
from cellgraph.dataflow.ops.placeholder_default import placeholder_with_default
from cellgraph.dataflow.ops.reductions import (
    argmax,
    argmin,
    moments,
    reduce_all,
    reduce_any,
    reduce_logsumexp,
    reduce_min,
    reduce_prod,
)
from cellgraph.dataflow.ops.resize import resize

# Every public op function, from every family, as cg.<name>.
from cellgraph.dataflow.ops.state import (
    assign,
    assign_add,
    constant,
    group,
    identity,
    no_op,
    placeholder,
    variable,
)
from cellgraph.dataflow.ops.top_k import top_k
from cellgraph.dataflow.ops.training import (
    apply_adagrad,
    apply_adam,
    apply_adamw,
    apply_gradient_descent,
    apply_momentum,
    apply_rmsprop,
)

__version__ = "0.1.0"

# The conveniences over the ops, and models out and in (a saved-model folder, and ONNX, whose
# onnx package is imported on first use); imported last, they use the names above.
from cellgraph import init, layers, losses, metrics, nn, onnx, optim  # noqa: E402
from cellgraph.saved_model import load_model, save_model  # noqa: E402


def _widget_bundler(name: str) -> Callable[[], _display.Bundler]:
    """A loader of ``cellgraph.widgets.reprs``'s bundler ``name``, imported at the first display only."""

    def load() -> _display.Bundler:
        from cellgraph.widgets import reprs

        bundler: _display.Bundler = getattr(reprs, name)
        return bundler

    return load


# A Graph, Cluster or Job shows as its widget in a kernel and as a text summary elsewhere: the lower layers ask
# dataflow.display, and this package, above every layer, points it at the widget side's functions.
for _kind, _bundler in (("graph", "graph_bundle"), ("cluster", "cluster_bundle"), ("job", "job_bundle")):
    _display.register(_kind, _widget_bundler(_bundler))


def load_ipython_extension(ipython: object) -> None:
    """``%load_ext cellgraph``: cell tracking and the magics (``cellgraph.kernel_ext``, imported only now)."""
    from cellgraph.kernel_ext import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython: object) -> None:
    """``%unload_ext cellgraph``: the magics and cell tracking go; graphs, cluster and jobs stay."""
    from cellgraph.kernel_ext import unload_ipython_extension as unload

    unload(ipython)


_NOT_API = frozenset({"annotations", "difflib", "Callable"})  # names this module imports for itself
_LAZY = ("Cluster", "ClusterError", "train", "Job")  # imported with Dask, at first use


def _public() -> list[str]:
    return [n for n in globals() if not n.startswith("_") and n not in _NOT_API] + list(_LAZY)


def __dir__() -> list[str]:
    """What ``cg.<Tab>`` offers: the public names, ``cg.train`` and ``cg.Cluster`` too (not yet imported), and
    none of the names this module imports for itself (``difflib``)."""
    return sorted({*_public(), "__version__"})


def __getattr__(name: str) -> object:
    """``cg.Cluster``, ``cg.train`` and ``cg.Job``: Dask is imported on first use, not by ``import cellgraph``."""
    if name in ("Cluster", "ClusterError"):
        from cellgraph.cluster import cluster

        return getattr(cluster, name)
    if name in ("train", "Job"):
        from cellgraph.cluster import job

        return getattr(job, name)
    # A misspelled op (cg.reduce_men) names the nearest public ones, as Python's own suggestion would.
    close = difflib.get_close_matches(name, _public(), n=3)
    hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
    raise AttributeError(f"module 'cellgraph' has no attribute {name!r}{hint}")
