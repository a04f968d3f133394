"""Import rows of ONNX ops that cellgraph computes as a few of its own ops: normalizations,
global pools, the norm reductions (ReduceL1, ReduceL2, ReduceSumSquare, ReduceLogSum),
ReduceMin (of bools too), Mean and Celu.

BatchNormalization normalizes with the running mean and variance
(``training_mode=0``), or with the batch's own statistics, giving the updated
running values as its other outputs (``training_mode=1``); its four parameter
tensors become variables, so a fine-tuned model updates scale and bias like any weight.

Examples
--------
>>> import numpy as np
>>> from onnx import TensorProto, helper, numpy_helper
>>> import cellgraph as cg
>>> params = [numpy_helper.from_array(np.array(v, np.float32), n)
...           for n, v in (("s", [2.0]), ("b", [1.0]), ("m", [3.0]), ("v", [4.0]))]
>>> node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], epsilon=0.0)
>>> graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2])],
...                           [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], params)
>>> model = cg.onnx.import_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
>>> model(np.array([[[3.0, 5.0]]], np.float32))
array([[[1., 3.]]], dtype=float32)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import cellgraph as cg
from cellgraph.dataflow.dtypes import is_float
from cellgraph.dataflow.graph import Tensor
from cellgraph.dataflow.ops import math_unary as mu
from cellgraph.dataflow.ops import reductions as red

from .common import ImportRow
from .import_wrappers import in_float32, same_shapes_before

if TYPE_CHECKING:
    from .importer import Builder
    from .node_info import NodeInfo


def per_channel(t: Tensor, rank: int) -> Tensor:
    """A (C,) parameter shaped to broadcast over NC... (channels on axis 1)."""
    return cg.reshape(t, (-1, *([1] * (rank - 2))))


def _batch_norm(b: Builder, n: NodeInfo) -> list[Tensor]:
    x, scale, bias, mean, var = b.ins(n, 5)
    rank = len(x.shape)
    eps = float(n.attrs["epsilon"])
    if not n.attrs["training_mode"]:
        factor = per_channel(scale, rank) / cg.sqrt(per_channel(var, rank) + eps)
        return [(x - per_channel(mean, rank)) * factor + per_channel(bias, rank)]
    # Training mode: the batch's own statistics (population variance) normalize, and the
    # running values move toward them by (1 - momentum).
    axes = (0, *range(2, rank))
    batch_mean = cg.reduce_mean(x, axis=axes, keepdims=True)
    centered = x - batch_mean
    batch_var = cg.reduce_mean(centered * centered, axis=axes, keepdims=True)
    y = centered * (per_channel(scale, rank) / cg.sqrt(batch_var + eps)) + per_channel(bias, rank)
    momentum = float(n.attrs["momentum"])
    flat_mean, flat_var = cg.reshape(batch_mean, (-1,)), cg.reshape(batch_var, (-1,))
    return [y, mean * momentum + flat_mean * (1.0 - momentum), var * momentum + flat_var * (1.0 - momentum)]


def _check_batch_norm(n: NodeInfo) -> str | None:
    if not n.attrs["training_mode"] and len([o for o in n.outputs if o]) > 1:
        return "BatchNormalization's running mean and variance outputs outside training mode"
    if n.rank(0) is None or n.rank(0) < 2:  # type: ignore[operator]
        return "BatchNormalization of an input of unknown rank or without channels"
    return None


def _layer_norm(b: Builder, n: NodeInfo) -> list[Tensor]:
    ins = b.ins(n)
    x, scale = ins[0], ins[1]
    rank = len(x.shape)
    axis = int(n.attrs["axis"]) % rank
    axes = tuple(range(axis, rank))
    mean = cg.reduce_mean(x, axis=axes, keepdims=True)
    centered = x - mean
    inv_std = 1.0 / cg.sqrt(cg.reduce_mean(centered * centered, axis=axes, keepdims=True) + float(n.attrs["epsilon"]))
    y = centered * inv_std * scale
    if len(ins) > 2:
        y = y + ins[2]
    # The mean and inverse deviation are of the stash type, float32, whatever the input's (float64).
    return [y, cg.cast(mean, "float32"), cg.cast(inv_std, "float32")]


def _check_layer_norm(n: NodeInfo) -> str | None:
    if n.rank(0) is None:
        return "LayerNormalization of an input of unknown rank"
    if int(n.attrs["stash_type"]) != 1:
        return f"LayerNormalization with stash_type {n.attrs['stash_type']} (cellgraph computes in the input's dtype)"
    return None


def _global_pool(fn: object) -> object:
    def build(b: Builder, n: NodeInfo) -> list[Tensor]:
        x = b.ins(n)[0]
        return [fn(x, axis=tuple(range(2, len(x.shape))), keepdims=True)]  # type: ignore[operator]

    return build


def _reduce_min(b: Builder, n: NodeInfo) -> list[Tensor]:
    x = b.ins(n)[0]
    axes = None
    if n.attrs.get("axes") is not None:
        axes = [int(a) for a in n.attrs["axes"]]
    elif len(n.inputs) > 1 and n.inputs[1]:
        axes = [int(a) for a in b.static(n.inputs[1]).reshape(-1)]
    if not axes and n.attrs["noop_with_empty_axes"]:
        return [cg.identity(x)]
    keep = bool(n.attrs["keepdims"])
    if x.dtype == "bool":  # the min of bools is their "all"
        return [red.reduce_all(x, axis=axes or None, keepdims=keep)]
    return [red.reduce_min(x, axis=axes or None, keepdims=keep)]


def _rms_norm(b: Builder, n: NodeInfo) -> list[Tensor]:
    x, scale = b.ins(n, 2)
    rank = len(x.shape)
    axes = tuple(range(int(n.attrs["axis"]) % rank, rank))
    mean_square = cg.reduce_mean(x * x, axis=axes, keepdims=True)
    return [x / cg.sqrt(mean_square + float(n.attrs["epsilon"])) * scale]


def _norm_reduce(kind: str) -> object:
    """ReduceL1, ReduceL2, ReduceSumSquare, ReduceLogSum: a map, ReduceSum, and a final step."""

    def build(b: Builder, n: NodeInfo) -> list[Tensor]:
        x = b.ins(n)[0]
        axes = None
        if n.attrs.get("axes") is not None:
            axes = [int(a) for a in n.attrs["axes"]]
        elif len(n.inputs) > 1 and n.inputs[1]:
            axes = [int(a) for a in b.static(n.inputs[1]).reshape(-1)]
        mapped = {"L1": lambda t: mu.abs(t), "L2": lambda t: t * t, "SumSquare": lambda t: t * t}.get(kind, lambda t: t)
        if not axes and n.attrs["noop_with_empty_axes"]:
            # A sum over no axes, but the map and the final step still apply (ONNX's spec: ReduceLogSum
            # is then the log of the input, ReduceSumSquare its square); it was the input unchanged.
            total = cg.identity(mapped(x))
        else:
            total = cg.reduce_sum(mapped(x), axis=axes or None, keepdims=bool(n.attrs["keepdims"]))
        if kind == "L2":
            return [
                cg.sqrt(total) if is_float(total.dtype) else cg.cast(cg.sqrt(cg.cast(total, "float64")), total.dtype)
            ]
        return [cg.log(total) if kind == "LogSum" else total]

    return build


def _celu(b: Builder, n: NodeInfo) -> list[Tensor]:
    x, alpha = b.ins(n)[0], float(n.attrs["alpha"])
    zero = cg.zeros_like(x)
    return [cg.maximum(x, zero) + cg.minimum(zero, mu.expm1(x / alpha) * alpha)]


def _mean(b: Builder, n: NodeInfo) -> list[Tensor]:
    ins = b.ins(n)
    total = ins[0]
    for t in ins[1:]:
        total = total + t
    return [total / float(len(ins))]


_REDUCE_ATTRS = {"axes": None, "keepdims": 1, "noop_with_empty_axes": 0}

NORMALIZATION: dict[str, ImportRow] = {
    "BatchNormalization": ImportRow(in_float32(_batch_norm, like=(0, 3, 4)), {"epsilon": 1e-5, "momentum": 0.9, "training_mode": 0},
                                    check=_check_batch_norm, since=9),
    "LayerNormalization": ImportRow(in_float32(_layer_norm, like=(0, None, None)), {"axis": -1, "epsilon": 1e-5, "stash_type": 1},
                                    check=_check_layer_norm),
    "GlobalAveragePool":  ImportRow(_global_pool(cg.reduce_mean)),  # type: ignore[arg-type]
    "GlobalMaxPool":      ImportRow(_global_pool(cg.reduce_max)),  # type: ignore[arg-type]
    "ReduceMin":          ImportRow(_reduce_min, _REDUCE_ATTRS, (1,)),
    "Mean":               ImportRow(in_float32(_mean), check=same_shapes_before(8)),
    "RMSNormalization":   ImportRow(in_float32(_rms_norm), {"axis": -1, "epsilon": 1e-5, "stash_type": 1},
                                    check=lambda n: None if n.rank(0) is not None else "RMSNormalization of unknown rank"),
    "ReduceL1":           ImportRow(in_float32(_norm_reduce("L1")), _REDUCE_ATTRS, (1,)),  # type: ignore[arg-type]
    "ReduceL2":           ImportRow(in_float32(_norm_reduce("L2")), _REDUCE_ATTRS, (1,)),  # type: ignore[arg-type]
    "ReduceSumSquare":    ImportRow(in_float32(_norm_reduce("SumSquare")), _REDUCE_ATTRS, (1,)),  # type: ignore[arg-type]
    "ReduceLogSum":       ImportRow(in_float32(_norm_reduce("LogSum")), _REDUCE_ATTRS, (1,)),  # type: ignore[arg-type]
    "Celu":               ImportRow(in_float32(_celu), {"alpha": 1.0}),
}  # fmt: skip
