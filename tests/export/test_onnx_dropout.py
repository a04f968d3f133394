"""ONNX Dropout in training mode imports as cellgraph's Dropout: a fresh mask each run, checked by its definition."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import cellgraph as cg
from cellgraph.onnx import conformance


def _dropout_model(ratio: float, seed: int | None = 5) -> onnx.ModelProto:
    attrs = {} if seed is None else {"seed": seed}
    node = helper.make_node("Dropout", ["x", "r", "t"], ["y", "z"], name="drop", **attrs)
    graph = helper.make_graph(
        [node],
        "dropout",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [40, 50])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [40, 50]),
         helper.make_tensor_value_info("z", TensorProto.BOOL, [40, 50])],
        [numpy_helper.from_array(np.array(ratio, np.float32), "r"), numpy_helper.from_array(np.array(True), "t")],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_training_dropout_keeps_one_minus_ratio_scaled_and_draws_anew_each_run() -> None:
    x = np.random.default_rng(0).normal(size=(40, 50)).astype(np.float32)
    model = cg.onnx.import_model(_dropout_model(0.75))
    first, second = model(x), model(x)
    for y, mask in (first, second):
        assert mask.dtype == np.bool_
        np.testing.assert_allclose(y, np.where(mask, x * 4.0, 0.0), rtol=1e-6)
        assert 400 < mask.sum() < 600  # 2000 elements, each kept with probability 0.25
        assert conformance.dropout_broken([x, np.float32(0.75), np.array(True)], [y, mask]) is None
    assert not np.array_equal(first[1], second[1])  # a fresh mask each run
    # The seed attribute seeds the draws: a model imported again replays the same masks.
    again = cg.onnx.import_model(_dropout_model(0.75))
    assert np.array_equal(again(x)[1], first[1])


def test_outputs_that_are_not_a_dropout_are_named_by_the_check() -> None:
    x = np.ones((40, 50), np.float32)
    mask = np.arange(2000).reshape(40, 50) % 2 == 0
    inputs = [x, np.float32(0.5), np.array(True)]
    assert conformance.dropout_broken(inputs, [np.where(mask, 2.0, 0.0).astype(np.float32), mask]) is None
    unscaled = np.where(mask, 1.0, 0.0).astype(np.float32)
    assert conformance.dropout_broken(inputs, [unscaled, mask]) == (
        "an output element is neither 0 nor x / (1 - ratio) as its mask says"
    )
    few = np.zeros((40, 50), bool)
    few[0, :10] = True
    assert conformance.dropout_broken(inputs, [np.where(few, 2.0, 0.0).astype(np.float32), few]) == (
        "10 of 2000 kept, expected about 1000"
    )
    assert conformance.dropout_broken(inputs, [unscaled, mask.astype(np.float32)]) == "the mask is float32, not bool"


def test_a_training_dropout_with_ratio_one_is_refused() -> None:
    with pytest.raises(
        cg.onnx.OnnxError,
        match=r"input 1 \('ratio'\) is 1.0, outside \[0, 1\), what ONNX's Dropout allows \(Dropout node 'drop', opset 17\)",
    ):
        cg.onnx.import_model(_dropout_model(1.0))


def test_the_conformance_counts_dropouts_random_cases_apart() -> None:
    results = conformance.run(["Dropout"])["Dropout"]
    assert results.failed == {} and results.unsupported == {}
    assert sorted(results.random) == [
        "test_training_dropout", "test_training_dropout_default", "test_training_dropout_default_mask",
        "test_training_dropout_mask",
    ]  # fmt: skip
    row = conformance.markdown_table({"Dropout": results}).splitlines()[2]
    assert row.endswith("| 4 passes are random draws, checked against the op's definition |")
