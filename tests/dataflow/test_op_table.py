"""The op table: every row of ``op_cases`` checked five ways.

1. the executor (the bound CPU kernels) against the op's NumPy reference,
   with elementwise fusion on and off,
2. the shape rule against the shape and dtype actually produced,
3. every CPU kernel the op registers against the reference,
4. the gradient rule against central finite differences in float64, fusion on and off,
5. the CUDA column: every CUDA kernel against the reference, on device arrays
   (tests marked ``cuda``: a real GPU, or Numba's simulator; see tests/conftest.py).
"""

from __future__ import annotations

import importlib
import pkgutil

import numpy as np
import pytest

import cellgraph as cg
from cellgraph.dataflow.kernels.cuda import simulator as cuda_simulator
from cellgraph.dataflow.opdef import OPS, KernelContext, not_differentiable
from cellgraph.dataflow.variables import VariableStore

from . import op_cases
from .op_cases import OpCase

CASES: list[OpCase] = []
for _info in pkgutil.iter_modules(op_cases.__path__):
    CASES += importlib.import_module(f"{op_cases.__name__}.{_info.name}").CASES

# Ops whose row cannot build the op node itself, and why.
BUILT_INDIRECTLY = {"Placeholder": "a placeholder is fed, never computed: its row feeds one through Identity"}
# Ops with no row, and why; each is tested where its behaviour lives.
NO_ROW = {
    "Send": "moves a value to another partition and computes nothing: tests/dataflow/test_partition.py",
    "Recv": "yields what its Send was given, nothing of its own: tests/dataflow/test_partition.py",
    "UpdateLossScale": "moves cg.optim.mixed_precision's loss scale and counters in place: "
    "tests/dataflow/test_mixed_precision.py",
}


def _build(case: OpCase, dtype_map: dict[str, str] | None = None):  # noqa: ANN202
    g = cg.Graph()
    inputs = [x.astype(dtype_map.get(x.dtype.name, x.dtype.name)) if dtype_map else x for x in case.inputs]
    with g.as_default():
        tensors = []
        for i, x in enumerate(inputs):
            if i in case.variables:
                tensors.append(cg.variable(x, name=f"v{i}"))
            else:
                shape = case.static_shapes[i] if case.static_shapes else x.shape
                tensors.append(cg.placeholder(shape, x.dtype.name, name=f"in{i}"))
        out = case.build(*tensors)
    feeds = {t: x for i, (t, x) in enumerate(zip(tensors, inputs)) if i not in case.variables}
    return g, tensors, out, feeds, inputs


def _outputs(result: object) -> list[np.ndarray]:
    return [np.asarray(r) for r in (result if isinstance(result, tuple) else (result,))]


FUSE = pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])


@FUSE
@pytest.mark.parametrize("case", CASES, ids=[c.label for c in CASES])
def test_forward_matches_reference_and_shape_rule(case: OpCase, fuse: bool) -> None:
    g, tensors, out, feeds, inputs = _build(case)
    node = out if isinstance(out, cg.Node) else out.node
    if case.op not in BUILT_INDIRECTLY:
        assert node.op == case.op, f"row builds {node.op}, not {case.op}"
    expected = _outputs(node.opdef.reference(node.attrs, *[x.copy() for x in _node_inputs(node, tensors, inputs)]))
    got = cg.Session(g, fuse=fuse).run(node.outputs, feeds)
    assert len(got) == len(expected) == len(node.specs)
    for value, want, spec in zip(got, expected, node.specs):
        assert value.dtype == np.dtype(spec.dtype), (
            f"{node.op}: kernel gave {value.dtype}, shape rule says {spec.dtype}"
        )
        assert len(value.shape) == len(spec.shape)
        assert all(s is None or s == v for s, v in zip(spec.shape, value.shape)), (spec.shape, value.shape)
        np.testing.assert_allclose(value, want, rtol=case.rtol, atol=case.atol)


def _node_inputs(node: cg.Node, tensors: list[cg.Tensor], inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Values of the node's inputs: ours where the node reads a row input directly,
    else computed by the executor (constants the op function added)."""
    by_id = {id(t.node): x for t, x in zip(tensors, inputs)}
    values = []
    for t in node.inputs:
        if id(t.node) in by_id:
            values.append(by_id[id(t.node)])
        else:
            sess = cg.Session(node.graph)
            feeds = {tt: x for tt, x in zip(tensors, inputs) if tt.node.op == "Placeholder"}
            values.append(sess.run(t, feeds))
    return values


@pytest.mark.parametrize("case", CASES, ids=[c.label for c in CASES])
def test_every_kernel_matches_reference(case: OpCase) -> None:
    g, tensors, out, feeds, inputs = _build(case)
    node = out if isinstance(out, cg.Node) else out.node
    args = _node_inputs(node, tensors, inputs)
    expected = _outputs(node.opdef.reference(node.attrs, *[x.copy() for x in args]))
    for device, factory in node.opdef.kernels.items():
        if device != "cpu":
            continue  # CUDA kernels take device arrays: test_cuda_kernel_matches_reference
        store = VariableStore()
        kernel = factory(node, KernelContext(store))
        got = _outputs(kernel(*[x.copy() for x in args]))
        for value, want in zip(got, expected):
            np.testing.assert_allclose(value, want, rtol=case.rtol, atol=case.atol, err_msg=f"{device} kernel")


# ------------------------------------------------------------ the CUDA column
def _built_op(case: OpCase) -> str:
    """The op of the node a row builds (a Placeholder row builds an Identity)."""
    _, _, out, _, _ = _build(case)
    return (out if isinstance(out, cg.Node) else out.node).op


# Ops whose CUDA kernel the column cannot compare with the reference, why, and where it is tested.
CUDA_NOT_COMPARED = {
    "Dropout": "a GPU mask is a counter-based hash of (seed, run, index), not NumPy's generator: "
    "tests/dataflow/test_cuda_nn.py checks its values, y == x * mask and the kept fraction",
}
CUDA_CASES = [c for c in CASES if "cuda" in OPS.lookup(_built_op(c)).kernels and _built_op(c) not in CUDA_NOT_COMPARED]
# Rows too big for the simulator, which runs every CUDA thread as a Python thread:
# a real GPU runs them; on the simulator the "gpu-blocks" rows cover the same kernels.
TOO_BIG_FOR_SIMULATOR = {
    "Conv2D-several-blocks": "65,536 outputs of 144 multiply-adds each: minutes on the simulator",
    "Conv2DBackpropInput-stride2-several-blocks": "65,536 outputs of 72 multiply-adds each: minutes",
    "Conv2DBackpropFilter-several-blocks": "2,304 threads each walking 4,096 pixels in 256 tiles: many minutes",
}
SIMULATED_CASES = [c for c in CUDA_CASES if c.label not in TOO_BIG_FOR_SIMULATOR]
COLUMN = SIMULATED_CASES if cuda_simulator() else CUDA_CASES


@pytest.mark.cuda
@pytest.mark.parametrize("case", COLUMN, ids=[c.label for c in COLUMN])
def test_cuda_kernel_matches_reference(case: OpCase) -> None:
    from numba import cuda

    g, tensors, out, feeds, inputs = _build(case)
    node = out if isinstance(out, cg.Node) else out.node
    args = _node_inputs(node, tensors, inputs)
    expected = _outputs(node.opdef.reference(node.attrs, *[x.copy() for x in args]))
    kernel = node.opdef.kernels["cuda"](node, KernelContext(VariableStore()))
    # np.array, not np.ascontiguousarray: that one makes a 0-d input (a scalar index) 1-d.
    result = kernel(*[cuda.to_device(np.array(x, order="C")) for x in args])
    got = [r.copy_to_host() for r in (result if isinstance(result, tuple) else (result,))]
    assert len(got) == len(expected) == len(node.specs)
    for value, want, spec in zip(got, expected, node.specs):
        assert value.dtype == np.dtype(spec.dtype), f"{node.op}: cuda kernel gave {value.dtype}, not {spec.dtype}"
        assert value.shape == np.shape(want), f"{node.op}: cuda kernel gave shape {value.shape}"
        np.testing.assert_allclose(value, want, rtol=case.rtol, atol=case.atol, err_msg="cuda kernel")


GRAD_CASES = [c for c in CASES if c.grad]


@FUSE
@pytest.mark.parametrize("case", GRAD_CASES, ids=[c.label for c in GRAD_CASES])
def test_gradient_matches_finite_differences(case: OpCase, fuse: bool) -> None:
    g, tensors, out, feeds, inputs = _build(case, {"float32": "float64"})
    wrt = case.wrt if case.wrt is not None else tuple(i for i, x in enumerate(inputs) if x.dtype.kind == "f")
    assert wrt, f"{case.label}: no float input to differentiate"
    # A fixed random projection makes every output element matter.
    weights = np.random.default_rng(1).uniform(0.5, 1.5, size=[d or 1 for d in out.shape] if out.shape else ())
    with g.as_default():
        w = cg.placeholder(weights.shape, out.dtype, name="projection")
        loss = cg.reduce_sum(out * w)
        grads = cg.gradients(loss, [tensors[i] for i in wrt])
    sess = cg.Session(g, fuse=fuse)
    run_feeds = {**feeds, w: weights.astype(out.dtype)}
    analytic = sess.run(grads, run_feeds)
    for i, got in zip(wrt, analytic):
        assert got is not None, f"no gradient reached input {i}"
        numeric = _numeric_grad(sess, loss, tensors, inputs, run_feeds, i, case)
        np.testing.assert_allclose(got, numeric, rtol=case.grad_rtol, atol=case.grad_atol, err_msg=f"input {i}")


def _numeric_grad(sess, loss, tensors, inputs, feeds, i, case):  # noqa: ANN001, ANN202
    eps = 1e-6
    x = inputs[i].astype(np.float64)
    numeric = np.zeros_like(x)
    for idx in np.ndindex(*x.shape):
        vals = []
        for sign in (1, -1):
            bumped = x.copy()
            bumped[idx] += sign * eps
            if i in case.variables:
                sess.variables.load(tensors[i].node, bumped)
                vals.append(float(sess.run(loss, feeds)))
                sess.variables.load(tensors[i].node, x)
            else:
                vals.append(float(sess.run(loss, {**feeds, tensors[i]: bumped})))
        numeric[idx] = (vals[0] - vals[1]) / (2 * eps)
    return numeric


def test_every_op_has_a_row() -> None:
    covered = {c.op for c in CASES}
    missing = [op for op in OPS if op not in covered and op not in NO_ROW]
    assert not missing, f"ops without a row in the op table: {missing}"


def test_every_op_has_a_gradient_decision_and_a_cpu_kernel() -> None:
    for name in OPS:
        opdef = OPS.lookup(name)
        assert opdef.grad is not_differentiable or callable(opdef.grad), name
        assert "cpu" in opdef.kernels, f"{name} has no cpu kernel"
