"""Each exported op stored in float16 and bfloat16: ONNX Runtime (float16) or ONNX's reference (bfloat16) as the session."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest
from onnx.reference import ReferenceEvaluator

import cellgraph as cg
from cellgraph.dataflow.ops import activations as act
from cellgraph.dataflow.ops import math_unary as mu

RNG = np.random.default_rng(11)


def _w(x: cg.Tensor, shape: tuple[int, ...]) -> cg.Tensor:
    return cg.constant(RNG.normal(size=shape).astype(x.dtype if x.dtype != "bfloat16" else ml_dtypes.bfloat16),
                       dtype=x.dtype)  # fmt: skip


def _image(x: cg.Tensor) -> cg.Tensor:
    return cg.reshape(x, (-1, 2, 2, 1))


# One row per op, built on a (None, 4) input of the half dtype.
OPS: dict[str, Callable[[cg.Tensor], cg.Tensor]] = {
    "matmul":      lambda x: cg.matmul(x, _w(x, (4, 5))),
    "add":         lambda x: x + x * 0.5,
    "sub_div":     lambda x: (x - cg.exp(x)) / cg.exp(x),
    "relu":        cg.relu,
    "sigmoid":     cg.sigmoid,
    "tanh":        cg.tanh,
    "softmax":     cg.softmax,
    "log_softmax": cg.log_softmax,
    "gelu":        act.gelu,
    "gelu_tanh":   lambda x: act.gelu(x, approximate=True),
    "sqrt":        lambda x: cg.sqrt(cg.exp(x)),
    "reductions":  lambda x: cg.reduce_sum(x, axis=1) + cg.reduce_mean(x, axis=1) + cg.reduce_max(x, axis=1),
    "argmax":      lambda x: cg.argmax(x, axis=1),
    "layer_norm":  lambda x: cg.layers.layer_norm(x, name="ln"),
    "leaky_elu":   lambda x: act.leaky_relu(x, 0.1) + act.elu(x, 0.7),
    "selu":        act.selu,
    "softplus":    act.softplus,
    "erf":         mu.erf,
    "pad_concat":  lambda x: cg.concat([cg.pad(x, ((0, 0), (1, 2)), constant_values=-1.5), x], 1),
    "transpose":   lambda x: cg.transpose(cg.reshape(x, (-1, 2, 2)), (0, 2, 1)),
    "casts":       lambda x: cg.cast(x, "float32") + cg.cast(cg.cast(x * 3.0, "int8"), "float32"),
    "compare":     lambda x: cg.cast(cg.equal(x, cg.maximum(x, cg.zeros_like(x))), x.dtype),
    "where":       lambda x: mu.where(cg.less(x, cg.zeros_like(x)), x, x * 2.0),
    "one_hot":     lambda x: cg.one_hot(cg.argmax(x, 1), 4, on_value=2.0, off_value=-1.0, dtype=x.dtype),
    "conv":        lambda x: cg.conv2d(_image(x), _w(x, (2, 2, 1, 3)), padding="SAME"),
    "pools":       lambda x: cg.max_pool(_image(x), 2, 1, "SAME") + cg.avg_pool(_image(x), 2, 1, "SAME"),
    "xent":        lambda x: cg.sparse_softmax_cross_entropy(x, cg.constant(np.array([1, 2, 3], np.int32))),
}  # fmt: skip
# The half types' machine epsilon: ONNX Runtime computes some float16 ops in float16 itself,
# and ONNX's reference some bfloat16 ones in bfloat16, where cellgraph computes in float32.
EPS = {"float16": 2.0**-10, "bfloat16": 2.0**-7}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("op", sorted(OPS))
def test_each_op_in_a_half_type_exports_and_runs_as_in_the_session(op: str, dtype: str, tmp_path: Path) -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 4), dtype, name="x")
        y = OPS[op](x)
    session = cg.Session(g)
    model = cg.onnx.export(tmp_path / "m.onnx", x, y, session)  # onnx.checker (full) passed
    images = RNG.normal(size=(3, 4)).astype(cg.dataflow.dtypes.DTYPES[dtype])
    want = np.asarray(session.run(y, {x: images}))
    if dtype == "float16":
        [got] = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, {"x": images}
        )
    else:  # ONNX Runtime's CPU provider has no bfloat16 kernels for these ops
        [got] = ReferenceEvaluator(model).run(None, {"x": images})
    assert got.dtype == want.dtype and got.shape == want.shape
    scale = max(1.0, float(np.abs(want.astype(np.float32)).max()))
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=0, atol=8 * EPS[dtype] * scale)
