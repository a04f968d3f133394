"""ONNX import against ONNX Runtime, the independent oracle: every swept row of ``IMPORTERS``, at
every version ONNX Runtime runs, every dtype and the attributes' edge values (``onnx_sweep*.py``).

A case agrees, is refused with an ``OnnxError`` naming the op, the node and the opset, or has no
oracle (ONNX Runtime has no kernel for that version and dtype). A wrong number, dtype or shape,
or any other error, fails its family's test with the case. Below the sweep, one focused test per
bug the sweep found, each stating the rule with values worked out by hand.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import cellgraph as cg
from cellgraph.onnx.common import OnnxError
from cellgraph.onnx.import_ops import IMPORTERS

from .onnx_sweep import Case, Const, check, imported, run_all
from .onnx_sweep_cases import FAMILIES, all_cases

# Rows the sweep leaves to other tests, and why.
NOT_SWEPT: dict[str, str] = {}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_agrees_with_onnx_runtime(family: str) -> None:
    results = run_all(all_cases([family]))
    assert not results["differ"], "\n".join(f"{c.describe()}: {v.detail}" for c, v in results["differ"])
    assert results["agree"], f"no case of {family} ran both in ONNX Runtime and cellgraph"
    for case, verdict in results["refused"]:
        # A refusal names the op, the node and the opset.
        assert f"{case.op} node 'swept', opset {case.opset}" in verdict.detail, verdict.detail


def _has_empty_input(case: Case) -> bool:
    return any(isinstance(v, np.ndarray) and v.size == 0 for v in case.inputs)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_agrees_with_onnx_runtime_when_its_inputs_are_constants(family: str) -> None:
    # Known ahead, a node was computed by ONNX's reference evaluator (of the newest version of the op:
    # Squeeze-1 ignored its axes, Softmax-1 was not flattened) and its quirks (Clip kept inf, MaxPool's
    # SAME_LOWER shape). Now only what a row needs at build time is computed ahead.
    # Left out: a Mean of an empty constant, which cellgraph's session folds to the wrong shape
    # ((0, 3) + (1, 3), then / 2, gave (1, 3)): a dataflow bug, reported.
    cases = [c for c in all_cases([family]) if not (c.op == "Mean" and _has_empty_input(c))]
    results = run_all(cases, constants=True)
    assert not results["differ"], "\n".join(f"{c.describe()}: {v.detail}" for c, v in results["differ"])


def test_every_import_row_is_swept_or_says_why() -> None:
    swept = {case.op for case in all_cases()}
    assert swept.isdisjoint(NOT_SWEPT)
    assert sorted(set(IMPORTERS) - swept - set(NOT_SWEPT)) == []


def test_a_wrong_number_is_reported_with_the_case() -> None:
    # The harness itself: a case whose expected value is wrong is a difference, not an agreement.
    case = Case("Neg", 13, [np.array([1, 2], np.int32)], expect=[np.array([-1, -3], np.int32)])
    verdict = check(case)
    assert verdict.kind == "differ"
    assert "1 of 2 values differ, first at (1,): cellgraph np.int32(-2)" in verdict.detail


def _one(op: str, opset: int, *inputs: object, **attrs: object) -> np.ndarray:
    """cellgraph's output 0 of one node (inputs: arrays fed at run time, or Const)."""
    return imported(Case(op, opset, list(inputs), attrs))[0]  # type: ignore[arg-type]


# ------------------------------------------------------------ the bugs the sweep found
def test_float_fmod_is_exact_for_large_quotients_and_infinite_divisors() -> None:
    # a - b * trunc(a / b) gave 0 for fmod(1e20, 3) and NaN for fmod(5, inf).
    a = np.array([1e20, -1e20, 5.0, -7.5, 7.0], np.float64)
    b = np.array([3.0, 3.0, np.inf, 2.0, -np.inf], np.float64)
    got = _one("Mod", 13, a, b, fmod=1)
    assert got.tolist() == [1.0, -1.0, 5.0, -1.5, 7.0]  # 1e20 is exact in float64, and 10**20 % 3 == 1
    assert _one("Mod", 13, a.astype(np.float32), b.astype(np.float32), fmod=1)[0] == np.fmod(np.float32(1e20), 3)


def test_integer_pow_is_exact_past_2_to_the_53() -> None:
    # Through float64, 3**39 came back as 4052555153018976256 (ONNX Runtime rounds the same way).
    base = np.array([3, -3, 2, -2, -1, 1, 2, 5], np.int64)
    exponent = np.array([39, 39, 62, 63, 2**40 + 1, 2**62, -1, 0], np.int64)
    got = _one("Pow", 15, base, exponent)
    assert got.tolist() == [3**39, (-3) ** 39, 2**62, -(2**63), -1, 1, 0, 1]
    assert _one("Pow", 15, np.array([2, -1, 1], np.int8), np.array([-2, -3, -5], np.int32)).tolist() == [0, -1, 1]


def test_pow_does_not_round_the_exponent_to_the_bases_type() -> None:
    # 5 ** 4.000001 rounded the exponent to float16 (4.0): 625 where the float16 nearest is 624.
    got = _one("Pow", 15, np.array([5.0], np.float16), np.array([3.9992], np.float64))
    assert got.dtype == np.float16 and got[0] == np.float16(5.0**3.9992)


def test_clip_without_a_bound_stops_at_the_types_largest_finite_value() -> None:
    # ONNX: an absent min or max is numeric_limits lowest() or max(), so inf is clipped.
    x = np.array([np.inf, -np.inf, 1.0, np.nan], np.float32)
    big = np.finfo(np.float32).max
    assert _one("Clip", 13, x, np.array(-2.0, np.float32)).tolist()[:3] == [big, -2.0, 1.0]
    assert _one("Clip", 13, x, None, np.array(0.5, np.float32)).tolist()[:3] == [0.5, -big, 0.5]
    assert np.isnan(_one("Clip", 13, x)[3])
    half = _one("Clip", 13, x.astype(np.float16), np.array(0.0, np.float16))
    assert half.tolist()[0] == 65504.0


def test_clip_6_reads_its_min_and_max_attributes() -> None:
    x = np.array([np.inf, -3.0, 0.5, 9.0], np.float32)
    assert _one("Clip", 7, x, min=-1.0, max=2.0).tolist() == [2.0, -1.0, 0.5, 2.0]
    assert _one("Clip", 7, x).tolist()[0] == float(np.finfo(np.float32).max)  # its default max


def test_clip_11_refuses_min_and_max_attributes() -> None:
    with pytest.raises(OnnxError) as err:
        _one("Clip", 13, np.array([1.0], np.float32), min=0.0)
    assert "Clip attribute 'min' (since version 11 min and max are inputs)" in str(err.value)
    assert "Clip node 'swept', opset 13" in str(err.value)


def test_sign_of_unsigned_integers_is_0_or_1() -> None:
    # cellgraph's Sign kernel (NumPy's sign under Numba) gave 255 for uint8 255.
    assert _one("Sign", 13, np.array([0, 1, 127, 128, 255], np.uint8)).tolist() == [0, 1, 1, 1, 1]


def test_float_attribute_defaults_are_float32_as_onnx_stores_them() -> None:
    # LeakyRelu without alpha used 0.01 exactly; with alpha=0.01 stored it is float32's 0.01.
    x = np.array([-1.0, -3.0], np.float64)
    default = _one("LeakyRelu", 16, x)
    stored = _one("LeakyRelu", 16, x, alpha=0.01)
    assert default.tolist() == stored.tolist() == (x * float(np.float32(0.01))).tolist()


def test_half_float_ops_built_of_several_ops_round_once() -> None:
    # HardSigmoid of float16 as x * alpha, then + beta, rounded twice: 0.1416, not 0.1414.
    x = np.array([-1.793], np.float16)
    want = np.float16(float(x[0]) * float(np.float32(0.2)) + 0.5)
    assert _one("HardSigmoid", 22, x)[0] == want == np.float16(0.1414)
    # A 1-D MatMul of float16 was products rounded to float16, then summed: 10 units in the last place off.
    a = np.array([0.955, 2.08, 1.836], np.float16)
    b = np.array([[-0.948], [2.018], [-2.006]], np.float16)
    exact = float(np.dot(a.astype(np.float64), b.astype(np.float64))[0])
    assert _one("MatMul", 13, a, b)[0] == np.float16(exact)
    # Sum of three float16 inputs: one rounding of the exact sum.
    terms = [np.array([v], np.float16) for v in (5.27, -4.164, -1.25)]
    assert _one("Sum", 13, *terms)[0] == np.float16(sum(float(t[0]) for t in terms))


@pytest.mark.parametrize(
    ("op", "want"),
    [("ReduceL1", [2.0, 3.0]), ("ReduceL2", [2.0, 3.0]), ("ReduceSumSquare", [4.0, 9.0]),
     ("ReduceLogSum", [np.nan, np.log(3.0)])],
)  # fmt: skip
def test_a_reduction_over_no_axes_still_maps_its_input(op: str, want: list[float]) -> None:
    # noop_with_empty_axes=1 and no axes: ONNX's spec keeps the map and the final step (the log, the
    # square); the input came back unchanged.
    x = np.array([-2.0, 3.0], np.float32)
    got = _one(op, 18, x, Const(np.array([], np.int64)), noop_with_empty_axes=1)
    np.testing.assert_allclose(got, np.array(want, np.float32), rtol=1e-7)


def test_a_node_cellgraph_cannot_build_is_named_in_the_error() -> None:
    with pytest.raises(OnnxError) as err:
        _one("ReduceMean", 18, np.array([1, 2], np.int32), keepdims=0)
    message = str(err.value)
    assert message.startswith("ReduceMean node 'swept', opset 18 does not build in cellgraph:")
    assert "expects a float tensor, got int32" in message


def test_the_sweep_uses_every_version_onnx_runtime_runs() -> None:
    # Clip-6 is in force at opset 7 (the oldest ONNX Runtime runs); Clip-11, -12 and -13 at their own.
    clips = sorted({c.opset for c in all_cases(["Clip"])})
    assert clips == [7, 11, 12, 13]


def test_versions_that_broadcast_nothing_refuse_inputs_of_different_shapes() -> None:
    # Max-6 (in force at opset 7) requires one shape; ONNX Runtime fails where cellgraph broadcast.
    a, b = np.zeros((2, 3), np.float32), np.zeros((3,), np.float32)
    with pytest.raises(OnnxError) as err:
        _one("Max", 7, a, b)
    assert "Max-6 of inputs whose shapes differ or are unknown (it broadcasts nothing)" in str(err.value)
    assert "Max node 'swept', opset 7" in str(err.value)
    assert _one("Max", 8, a, b).shape == (2, 3)  # Max-8 broadcasts


def test_layer_normalization_gives_its_mean_and_deviation_in_float32() -> None:
    # The stash type (float32) is their type whatever the input's: they came back float64.
    x = np.array([[1.0, 2.0, 4.0]], np.float64)
    y, mean, inv_std = imported(Case("LayerNormalization", 17, [x, np.ones(3)], {"epsilon": 0.0}, outputs=3))
    assert (y.dtype, mean.dtype, inv_std.dtype) == (np.float64, np.float32, np.float32)
    assert mean.tolist() == [[float(np.float32(7.0 / 3.0))]]


def test_batch_normalization_of_float16_rounds_once() -> None:
    x = np.array([[1.0], [2.0], [3.0]], np.float16).reshape(1, 3, 1)
    params = [Const(np.full(3, v, np.float16)) for v in (1.1, 0.3, 0.7, 0.9)]
    got = _one("BatchNormalization", 15, x, *params, epsilon=0.0)
    exact = (x.astype(np.float64) - 0.7001953125) / np.sqrt(0.89990234375) * 1.099609375 + 0.300048828125
    assert got.tolist() == exact.astype(np.float16).tolist()


def test_max_pool_of_integers_gives_int64_indices() -> None:
    # The integers pool in float64 and come back; the Indices came back as int8 too.
    x = np.array([[[[1, 5], [7, -3]]]], np.int8)
    values, indices = imported(Case("MaxPool", 12, [x], {"kernel_shape": [2, 2]}, outputs=2))
    assert (values.dtype, values.tolist()) == (np.int8, [[[[7]]]])
    assert (indices.dtype, indices.tolist()) == (np.int64, [[[[2]]]])


def test_average_pool_of_float16_rounds_once() -> None:
    # A 3-D pool is the mean of one slice per kernel offset: each add rounded to float16 was 10 ulps off.
    x = np.array([0.1, 0.2, 0.3, -0.55, 0.7, 0.3, -1.1, 0.8], np.float16).reshape(1, 1, 2, 2, 2)
    got = _one("AveragePool", 19, x, kernel_shape=[2, 2, 2])
    assert got.reshape(-1)[0] == np.float16(x.astype(np.float64).mean())


def test_flatten_of_an_empty_batch() -> None:
    # (0, 3, 2) at axis 1 was a reshape to (0, -1), which no size solves.
    assert _one("Flatten", 13, np.zeros((0, 3, 2), np.float32), axis=1).shape == (0, 6)


def test_cast_1_names_its_type_as_a_string() -> None:
    # Cast-1's `to` is "INT32", not a TensorProto code: int(b"INT32") failed with a ValueError.
    assert _one("Cast", 1, np.array([1.7, -2.5], np.float32), to="INT32").tolist() == [1, -2]
    with pytest.raises(OnnxError) as err:
        _one("Cast", 1, np.array([1.0], np.float32), to="INT33")
    assert "Cast to b'INT33', which is no ONNX type" in str(err.value)


def test_relu_of_integers() -> None:
    # Relu-14 takes int8 to int64; cellgraph's relu is for floats and refused them.
    x = np.array([-128, -1, 0, 5, 127], np.int8)
    assert _one("Relu", 14, x).tolist() == [0, 0, 0, 5, 127]


@pytest.mark.parametrize(("code", "dtype"), [(TensorProto.UINT32, np.uint32), (TensorProto.UINT16, np.uint16)])
def test_unsigned_types_computed_wider_wrap_at_every_node(code: int, dtype: type) -> None:
    # uint32 is computed in int64: 1 - 2 stayed -1 until the model's boundary, so Less(1 - 2, 10) was
    # true, (1 - 2) / 10 was 0 and Cast(1 - 2, FLOAT) was -1. ONNX wraps it to 2**32 - 1 at once.
    nodes = [
        helper.make_node("Sub", ["a", "b"], ["d"]),
        helper.make_node("Less", ["d", "c"], ["less"]),
        helper.make_node("Div", ["d", "c"], ["q"]),
        helper.make_node("Cast", ["d"], ["f"], to=TensorProto.FLOAT),
    ]
    outputs = [
        helper.make_tensor_value_info(n, t, [2])
        for n, t in (("less", TensorProto.BOOL), ("q", code), ("f", TensorProto.FLOAT))
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, code, [2]) for n in "abc"], outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    top = int(np.iinfo(dtype).max)
    less, q, f = cg.onnx.import_model(model)(*(np.array(v, dtype) for v in ([1, 5], [2, 3], [10, 10])))
    assert less.tolist() == [False, True]
    assert q.tolist() == [top // 10, 0]
    assert f.tolist() == [float(np.float32(top)), 2.0]


def test_top_k_smallest_puts_nan_last_and_takes_integers() -> None:
    # The smallest were the largest of -x, and -NaN is NaN: NaN came first among the smallest.
    x = np.array([[3.0, np.nan, -np.inf, 1.0]], np.float32)
    values, indices = imported(Case("TopK", 11, [x, Const(np.array([2], np.int64))], {"largest": 0}, outputs=2))
    assert values.tolist() == [[-np.inf, 1.0]] and indices.tolist() == [[2, 3]]
    # Integers were refused (-x of the lowest int overflows): -1 - x reverses their order exactly.
    ints = np.array([[5, -128, 127, -128, 0]], np.int8)
    values, indices = imported(Case("TopK", 11, [ints, Const(np.array([3], np.int64))], {"largest": 0}, outputs=2))
    assert values.tolist() == [[-128, -128, 0]] and indices.tolist() == [[1, 3, 4]]


def test_softmax_before_version_13_is_over_the_input_flattened_at_its_axis() -> None:
    # Softmax-11 along axis 1 (its default) of (2, 3, 2) is over the last 6 values of each row
    # together; it was refused (cellgraph read 13 or newer).
    x = np.arange(12, dtype=np.float64).reshape(2, 3, 2)
    flat = np.exp(x.reshape(2, 6) - x.reshape(2, 6).max(1, keepdims=True))
    want = (flat / flat.sum(1, keepdims=True)).reshape(2, 3, 2)
    np.testing.assert_allclose(_one("Softmax", 11, x), want, rtol=1e-12)
    np.testing.assert_allclose(_one("Softmax", 13, x, axis=1).sum(axis=1), np.ones((2, 2)), rtol=1e-12)
    hard = _one("Hardmax", 11, x, axis=0)  # one 1 in the whole flattened input
    assert hard.sum() == 1.0 and hard[1, 2, 1] == 1.0
    with pytest.raises(OnnxError) as err:
        _one("Softmax", 11, x, axis=3)
    assert "attribute 'axis' is 3, outside [-3, 2], what ONNX's Softmax allows for a rank-3 input" in str(err.value)


def test_a_node_of_constants_computes_as_its_row_does() -> None:
    # Folded by ONNX's reference given the node alone (so its newest version), Squeeze-1 dropped
    # every unit axis, not the one named, and Clip without bounds kept inf.
    squeeze = Case("Squeeze", 7, [np.zeros((1, 3, 1), np.int16)], {"axes": [0]})
    assert imported(squeeze, constants=True)[0].shape == (3, 1)
    clip = Case("Clip", 13, [np.array([np.inf, 1.0], np.float32)])
    assert imported(clip, constants=True)[0].tolist() == [float(np.finfo(np.float32).max), 1.0]
    softmax = Case("Softmax", 11, [np.arange(12, dtype=np.float64).reshape(2, 3, 2)])
    np.testing.assert_allclose(imported(softmax, constants=True)[0].sum(axis=(1, 2)), [1.0, 1.0], rtol=1e-12)


def test_convolution_of_float16_with_a_bias_rounds_once() -> None:
    # The convolution rounded to float16, then the bias added and rounded again: -0.717, not -0.716.
    x = np.array([0.09454345703125, 3.603515625, -2.84765625], np.float16).reshape(1, 1, 1, 3)
    w = np.array([3.58984375, -1.5048828125, -0.61328125], np.float16).reshape(1, 1, 1, 3)
    bias = np.array([2.62109375], np.float16)
    exact = np.float16((x.astype(np.float64) * w.astype(np.float64)).sum() + 2.62109375)
    got = imported(Case("Conv", 11, [x, Const(w), Const(bias)]))[0]
    assert got.dtype == np.float16 and got.reshape(-1)[0] == exact == np.float16(-0.716)


def test_gemm_with_beta_0_does_not_read_c() -> None:
    # 0 * inf is NaN: C's inf and NaN spread over every row; ONNX Runtime (as BLAS) leaves C unread.
    a, b = np.ones((2, 3), np.float32), np.ones((3, 2), np.float32)
    c = np.array([np.inf, np.nan], np.float32)
    assert _one("Gemm", 13, a, b, c, beta=0.0).tolist() == [[3.0, 3.0], [3.0, 3.0]]


@pytest.mark.parametrize(
    ("shape", "words"),
    [(["n", 3, 4], "Softmax-11 (over the input flattened to 2-D) of a shape unknown until the graph runs"),
     (None, "Softmax-11 of an input whose rank is unknown until the graph runs")],
)  # fmt: skip
def test_softmax_before_version_13_needs_the_shape_it_flattens(shape: list[object] | None, words: str) -> None:
    node = helper.make_node("Softmax", ["x"], ["y"], name="old", axis=1)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    graph = helper.make_graph([node], "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    with pytest.raises(OnnxError) as err:
        cg.onnx.import_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)]))
    assert f"{words} has no cellgraph equivalent (Softmax node 'old', opset 11)" in str(err.value)
