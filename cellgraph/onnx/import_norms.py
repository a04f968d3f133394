"""Import rows of ONNX's normalizations over groups of axes: InstanceNormalization, GroupNormalization,
LpNormalization and MeanVarianceNormalization, each as a few cellgraph ops (means, a square root, a division).

InstanceNormalization normalizes each image's channel over its spatial axes;
GroupNormalization each image's group of channels (``num_groups``) over
those channels and the spatial axes, then scales per channel (version 21; per
group in version 18, as ONNX defined it then). Their scales and biases are
variables when they are initializers, so an imported model fine-tunes them.
Half floats are computed in float32 and rounded once.

Examples
--------
>>> import numpy as np
>>> from onnx import TensorProto, helper
>>> import cellgraph as cg
>>> node = helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], epsilon=0.0)
>>> graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2])],
...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
...     [helper.make_tensor("s", TensorProto.FLOAT, [1], [2.0]), helper.make_tensor("b", TensorProto.FLOAT, [1], [1.0])])
>>> model = cg.onnx.import_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
>>> model(np.array([[[1.0, 3.0]]], np.float32))
array([[[-1.,  3.]]], dtype=float32)
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import cellgraph as cg
from cellgraph.dataflow.graph import Tensor

from .common import ImportRow
from .import_normalization import per_channel
from .import_wrappers import in_float32

if TYPE_CHECKING:
    from .importer import Builder
    from .node_info import NodeInfo


def _normalized(x: Tensor, axes: tuple[int, ...], epsilon: float) -> Tensor:
    """``x`` less its mean over ``axes``, over its standard deviation there (population variance + epsilon)."""
    centered = x - cg.reduce_mean(x, axis=axes, keepdims=True)
    return centered / cg.sqrt(cg.reduce_mean(centered * centered, axis=axes, keepdims=True) + epsilon)


def _instance_norm(b: Builder, n: NodeInfo) -> list[Tensor]:
    x, scale, bias = b.ins(n, 3)
    rank = len(x.shape)
    y = _normalized(x, tuple(range(2, rank)), float(n.attrs["epsilon"]))
    return [y * per_channel(scale, rank) + per_channel(bias, rank)]


def _group_norm(b: Builder, n: NodeInfo) -> list[Tensor]:
    x, scale, bias = b.ins(n, 3)
    groups = int(n.attrs["num_groups"])
    shape = x.shape
    channels, spatial = int(shape[1]), [int(d) for d in shape[2:]]  # type: ignore[arg-type]
    grouped = cg.reshape(x, (-1, groups, channels // groups * math.prod(spatial)))
    y = _normalized(grouped, (2,), float(n.attrs["epsilon"]))
    if n.version < 21:  # version 18: one scale and bias per group
        y = y * cg.reshape(scale, (groups, 1)) + cg.reshape(bias, (groups, 1))
        return [cg.reshape(y, (-1, channels, *spatial))]
    rank = len(shape)
    y = cg.reshape(y, (-1, channels, *spatial))
    return [y * per_channel(scale, rank) + per_channel(bias, rank)]


def _check_group_norm(n: NodeInfo) -> str | None:
    shape = n.shape(0)
    if shape is None or len(shape) < 2 or None in shape[1:]:
        return "GroupNormalization of an input whose channels or spatial sizes are unknown until the graph runs"
    # num_groups dividing the channels: import_limits.py.
    if int(n.attrs.get("stash_type", 1)) != 1:
        return f"GroupNormalization with stash_type {n.attrs['stash_type']} (cellgraph computes in float32 or wider)"
    return None


def _lp_norm(b: Builder, n: NodeInfo) -> list[Tensor]:
    x = b.ins(n, 1)[0]
    axis = int(n.attrs["axis"]) % len(x.shape)
    if int(n.attrs["p"]) == 1:
        norm = cg.reduce_sum(cg.abs(x), axis=axis, keepdims=True)
    else:
        norm = cg.sqrt(cg.reduce_sum(x * x, axis=axis, keepdims=True))
    # A zero norm gives zeros, not 0 / 0 (as ONNX's reference and ONNX Runtime); the divisor is made 1 there, so
    # that no NaN reaches the gradient either.
    zero = cg.equal(norm, cg.zeros_like(norm))
    return [cg.where(zero, cg.zeros_like(x), x / cg.where(zero, cg.ones_like(norm), norm))]


def _check_lp_norm(n: NodeInfo) -> str | None:
    if int(n.attrs["p"]) not in (1, 2):
        return f"LpNormalization with p={n.attrs['p']} (ONNX defines 1 and 2)"
    if n.rank(0) is None:
        return "LpNormalization of an input of unknown rank"
    return None


def _mean_variance_norm(b: Builder, n: NodeInfo) -> list[Tensor]:
    # ONNX's function body: (x - E[x]) / (sqrt(E[x^2] - E[x]^2) + 1e-9).
    x = b.ins(n, 1)[0]
    axes = tuple(int(a) % len(x.shape) for a in n.attrs["axes"])
    mean = cg.reduce_mean(x, axis=axes, keepdims=True)
    deviation = cg.sqrt(cg.reduce_mean(x * x, axis=axes, keepdims=True) - mean * mean)
    return [(x - mean) / (deviation + 1e-9)]


def _known_rank(op: str) -> object:
    def check(n: NodeInfo) -> str | None:
        return f"{op} of an input of unknown rank" if n.rank(0) is None else None

    return check


NORMS: dict[str, ImportRow] = {
    "InstanceNormalization":     ImportRow(in_float32(_instance_norm), {"epsilon": 1e-5},
                                           check=_known_rank("InstanceNormalization")),  # type: ignore[arg-type]
    "GroupNormalization":        ImportRow(in_float32(_group_norm), {"epsilon": 1e-5, "num_groups": 1, "stash_type": 1},
                                           check=_check_group_norm, since=18),
    "LpNormalization":           ImportRow(in_float32(_lp_norm), {"axis": -1, "p": 2}, check=_check_lp_norm),
    "MeanVarianceNormalization": ImportRow(in_float32(_mean_variance_norm), {"axes": [0, 2, 3]},
                                           check=_known_rank("MeanVarianceNormalization"), since=9),  # type: ignore[arg-type]
}  # fmt: skip
