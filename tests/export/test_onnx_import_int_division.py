"""ONNX's integer Div and Mod come in exact, truncated as C's, for every value of every int type.

They went through float64 before, which rounds an int64 above 2**53: ``(2**60 + 1) / 1``
came back as 2**60 with no error. ONNX Runtime is the independent answer here.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import cellgraph as cg

BIG = 2**60 + 1  # not a float64: the nearest is 2**60


def _values(dtype: type) -> tuple[np.ndarray, np.ndarray]:
    info = np.iinfo(dtype)
    if info.min == 0:
        return np.array([7, 0, info.max, info.max - 1, 9], dtype), np.array([2, 3, 1, 7, 9], dtype)
    # Every sign pair, exact and inexact quotients, the extremes (but not min // -1, which overflows).
    a = [7, -7, 7, -7, 6, -6, 0, info.max, info.min + 1, info.min, info.max]
    b = [2, 2, -2, -2, -3, 3, 5, 1, 3, 7, -1]
    if dtype is np.int64:
        a += [BIG, -BIG, BIG]
        b += [1, 3, -(2**40)]
    return np.array(a, dtype), np.array(b, dtype)


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.int16, np.int8, np.uint8])
@pytest.mark.parametrize(("op", "attrs"), [("Div", {}), ("Mod", {"fmod": 1}), ("Mod", {"fmod": 0})])
def test_integer_div_and_mod_equal_onnx_runtime_exactly(dtype: type, op: str, attrs: dict) -> None:
    onnx_type = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inputs = [helper.make_tensor_value_info(name, onnx_type, [None]) for name in ("a", "b")]
    output = helper.make_tensor_value_info("y", onnx_type, [None])
    graph = helper.make_graph([helper.make_node(op, ["a", "b"], ["y"], **attrs)], "g", inputs, [output])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    a, b = _values(dtype)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"a": a, "b": b})[0]
    got = cg.onnx.import_model(model)(a, b)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_big_int64_quotients_are_not_rounded_through_float64() -> None:
    inputs = [helper.make_tensor_value_info(name, TensorProto.INT64, [None]) for name in ("a", "b")]
    output = helper.make_tensor_value_info("y", TensorProto.INT64, [None])
    graph = helper.make_graph([helper.make_node("Div", ["a", "b"], ["y"])], "g", inputs, [output])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    got = cg.onnx.import_model(model)(np.array([BIG, -BIG], np.int64), np.array([1, 1], np.int64))
    assert got.tolist() == [BIG, -BIG]  # a statement of the rule, independent of any runtime
