"""The narrow dtypes: float16 and bfloat16 (stored, computed in float32), int8, uint8, int16.

Their names, their GraphDef and TensorProto round trips, casts between every
pair (bit for bit what NumPy and ml_dtypes give: round to nearest even), feeds,
fetches and variables, and the words of the refusals.
"""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest

import cellgraph as cg
from cellgraph.dataflow.dtypes import DTYPES, as_dtype, is_float, is_half
from cellgraph.dataflow.graphdef import from_graphdef, from_tensor_proto, to_graphdef, to_tensor_proto
from cellgraph.dataflow.opdef import KernelContext
from cellgraph.dataflow.variables import VariableStore

from .errors_helpers import raises

NEW = ["float16", "bfloat16", "int8", "uint8", "int16"]
# The numeric dtypes: a string tensor holds no bytes to round-trip and casts to nothing
# (tests/dataflow/test_strings.py).
ALL = [d for d in DTYPES if d != "string"]


def _values(dtype: str) -> np.ndarray:
    """A few values of ``dtype``, extremes included."""
    if dtype == "bool":
        return np.array([True, False, True])
    if dtype in ("float16", "bfloat16", "float32", "float64"):
        info = ml_dtypes.finfo(DTYPES[dtype])
        return np.array([0.0, -1.5, 3.25, float(info.max), float(info.tiny), -7.0], DTYPES[dtype])
    ints = np.iinfo(DTYPES[dtype])
    return np.array([0, 1, ints.min, ints.max, 7], DTYPES[dtype])


@pytest.mark.parametrize("value", ["bfloat16", ml_dtypes.bfloat16, np.dtype(ml_dtypes.bfloat16)])
def test_bfloat16_has_one_name(value: object) -> None:
    assert as_dtype(value) == "bfloat16"  # type: ignore[arg-type]


@pytest.mark.parametrize("dtype", NEW)
def test_new_dtypes_are_known_by_name_and_numpy_type(dtype: str) -> None:
    assert as_dtype(dtype) == dtype
    assert as_dtype(DTYPES[dtype].type) == dtype
    assert is_float(dtype) == (dtype in ("float16", "bfloat16"))
    assert is_half(dtype) == (dtype in ("float16", "bfloat16"))


@pytest.mark.parametrize("dtype", ALL)
def test_tensor_proto_round_trip_is_bit_exact(dtype: str) -> None:
    value = _values(dtype)
    back = from_tensor_proto(to_tensor_proto(value))
    assert back.dtype == value.dtype
    assert back.tobytes() == value.tobytes()


@pytest.mark.parametrize("dtype", NEW)
def test_graphdef_round_trip_keeps_placeholders_constants_and_variables(dtype: str) -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, None), dtype, name="x")
        c = cg.constant(_values(dtype), dtype=dtype, name="c")
        v = cg.variable(_values(dtype), dtype=dtype, name="v")
        cg.identity(x, name="xi"), cg.identity(c, name="ci"), cg.identity(v, name="vi")
    graphdef = to_graphdef(g)
    g2 = from_graphdef(graphdef)
    assert to_graphdef(g2) == graphdef
    assert [g2.tensor(n).dtype for n in ("x:0", "c:0", "v:0")] == [dtype] * 3
    sess = cg.Session(g2)
    got = sess.run(["xi:0", "ci:0", "vi:0"], {"x:0": _values(dtype)[None]})
    for array in got:
        assert array.dtype == DTYPES[dtype]
        assert array.reshape(-1).tobytes() == _values(dtype).tobytes()


@pytest.mark.parametrize(("src", "dst"), list(itertools.product(ALL, ALL)))
def test_cast_between_every_pair_is_numpys_cast(src: str, dst: str) -> None:
    value = _values(src)
    if DTYPES[src].kind in "fV" and dst not in ("float16", "bfloat16", "float32", "float64", "bool"):
        # float -> int outside the int's range (negatives for uint8) is undefined in C and NumPy
        value = value[[0, 2]] if dst == "uint8" else value[[0, 1, 2, 5]]
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None,), src, name="x")
        y = cg.cast(x, dst)
    got = cg.Session(g).run(y, {x: value})
    with np.errstate(over="ignore", invalid="ignore"):
        want = value.astype(DTYPES[dst])
    assert got.dtype == DTYPES[dst]
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize(
    ("dtype", "ulp"),
    [("float16", 2.0**-10), ("bfloat16", 2.0**-7)],
)
def test_cast_to_half_rounds_to_nearest_even(dtype: str, ulp: float) -> None:
    # Halfway between 1 and 1 + ulp goes down to the even 1; halfway between
    # 1 + ulp and 1 + 2 ulp goes up to the even 1 + 2 ulp; just past half goes up.
    value = np.array([1 + ulp / 2, 1 + 3 * ulp / 2, 1 + ulp / 2 + ulp / 64, 70000.0], np.float32)
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((4,), "float32", name="x")
        y = cg.cast(x, dtype)
    got = cg.Session(g).run(y, {x: value}).astype(np.float64)
    assert got[:3].tolist() == [1.0, 1 + 2 * ulp, 1 + ulp]
    assert got[3] == (np.inf if dtype == "float16" else 70144.0)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cast_gradient_flows_between_half_and_float32(dtype: str) -> None:
    g = cg.Graph()
    with g.as_default():
        w = cg.variable([1.0, 2.0, 3.0], name="w")
        y = cg.reduce_sum(cg.cast(w, dtype) * cg.cast(w, dtype))
        (dw,) = cg.gradients(y, [w])
    assert dw.dtype == "float32"
    sess = cg.Session(g)
    np.testing.assert_array_equal(sess.run(dw), [2.0, 4.0, 6.0])


def test_feeds_are_rounded_into_the_placeholders_dtype() -> None:
    g = cg.Graph()
    with g.as_default():
        h = cg.placeholder((2,), "bfloat16", name="h")
        i = cg.placeholder((2,), "uint8", name="i")
    got_h, got_i = cg.Session(g).run(
        [cg.identity(h), cg.identity(i)], {h: [1.0 + 2.0**-8, 3.0], i: np.array([255, 0], np.uint8)}
    )
    assert got_h.dtype == DTYPES["bfloat16"] and got_h.astype(np.float32).tolist() == [1.0, 3.0]
    assert got_i.dtype == np.uint8 and got_i.tolist() == [255, 0]


def test_python_value_outside_a_narrow_ints_range_is_refused() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((2,), "int8", name="x")
        before = len(g.nodes)
        with raises(
            cg.DTypeError, "Add: cannot use 300 as an int8 value: it holds 300, outside int8's range [-128, 127]"
        ):
            x + 300
        assert len(g.nodes) == before


@pytest.mark.parametrize(("build", "words"), [
    (lambda x: cg.log(x), "Log 'log'"),
    (lambda x: cg.sqrt(x), "Sqrt 'sqrt'"),
    (lambda x: x / x, "Div 'div'"),
])  # fmt: skip
@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16"])
def test_float_ops_refuse_narrow_ints_naming_op_node_and_dtype(build: object, words: str, dtype: str) -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((2,), dtype, name="x")
        with pytest.raises(cg.DTypeError) as err:
            build(x)  # type: ignore[operator]
    op, node = words.split(" ")
    assert str(err.value).startswith(f"{op} {node}")
    assert str(err.value).endswith(f": expects a float tensor, got {dtype}") or str(err.value).endswith(
        f": expects float tensors, got {dtype}"
    )


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cuda_kernels_refuse_half_floats_naming_the_node(dtype: str) -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((2,), dtype, name="x")
        y = cg.exp(x, name="e")
    node = y.node
    with raises(
        cg.KernelNotFound,
        f"{node.describe()} has no cuda kernel for {dtype}: half floats are storage-only and computed on the "
        "cpu device (cast to float32 to run it on a GPU)",
    ):
        node.opdef.kernels["cuda"](node, KernelContext(VariableStore()))


def test_negative_python_int_is_refused_for_a_uint8_tensor() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((2,), "uint8", name="x")
        with raises(cg.DTypeError, "Sub: cannot use -1 as a uint8 value: it holds -1, outside uint8's range [0, 255]"):
            x - (-1)


class _Capture:
    """A transport that keeps what is sent (the in-process one hands arrays over as they are)."""

    def __init__(self) -> None:
        self.sent: dict[str, np.ndarray] = {}

    def send(self, key: str, value: np.ndarray) -> None:
        self.sent[key] = value


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_half_tensor_crosses_partitions_in_its_own_dtype(dtype: str) -> None:
    ps, worker = "/job:ps/task:0/device:cpu:0", "/job:worker/task:0/device:cpu:0"
    g = cg.Graph()
    with g.as_default():
        w = cg.variable([1.5, -2.0], dtype=dtype, name="w")
        cg.identity(w * 2.0, name="y")
    parts = cg.partition(g, {n.name: ps if n.name == "w" else worker for n in g.nodes})
    send = next(n for n in parts.graphs[ps].nodes if n.op == "Send")
    transport = _Capture()
    kernel = send.opdef.kernels["cpu"](send, KernelContext(VariableStore(), transport))
    kernel(np.array([1.5, -2.0], DTYPES[dtype]))
    (value,) = transport.sent.values()
    assert value.dtype == DTYPES[dtype]
    session = cg.PartitionedSession(g, parts.device_of)
    assert session.run("y:0").astype(np.float32).tolist() == [3.0, -4.0]
