"""The size-0 audit: every row of the op table again, with an empty dimension.

For every row of ``op_cases`` and every axis of every input, a variant of the
row has size 0 along that axis, and along every axis of the other inputs that
the op ties to it (so that the inputs still fit together: both operands of a
matrix product's inner dimension, a broadcast partner, ...). Each variant runs

1. through a Session, fused and unfused, against the op's NumPy reference
   (shape, dtype and values), and
2. through every CUDA kernel of the op, on device arrays (tests marked ``cuda``).

Where the reference raises for the emptied inputs (argmax over an empty axis,
an index into an empty axis), the run must fail with an ``ExecutionError``
that names the node and says the words the op documents (``ERROR_WORDS``).
An axis that cannot be emptied gets its reason from the op's rule, and a row
with no variant at all gets one in ``NO_VARIANT``: none is skipped silently.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import cellgraph as cg
from cellgraph.dataflow.kernels.cuda import simulator as cuda_simulator
from cellgraph.dataflow.opdef import OPS, KernelContext
from cellgraph.dataflow.ops.array_slice import _index
from cellgraph.dataflow.variables import VariableStore

from .op_cases import OpCase
from .test_op_table import CASES, NO_ROW, TOO_BIG_FOR_SIMULATOR, _build, _node_inputs, _outputs

Shapes = tuple[tuple[int, ...], ...]
# A rule gets the row's node, its input shapes and one (input, axis) to empty;
# it returns the emptied shapes of every input, or why that axis cannot be empty.
Rule = Callable[[cg.Node, Shapes, int, int], "Shapes | str"]


def _node(case: OpCase) -> cg.Node:
    out = _build(case)[2]
    return out if isinstance(out, cg.Node) else out.node


def _set(shapes: Shapes, sizes: dict[tuple[int, int], int]) -> Shapes:
    """``shapes`` with dim ``(input, axis)`` set to each size in ``sizes``."""
    return tuple(tuple(sizes.get((i, a), d) for a, d in enumerate(shape)) for i, shape in enumerate(shapes))


def _zero(shapes: Shapes, dims: list[tuple[int, int]]) -> Shapes:
    return _set(shapes, dict.fromkeys(dims, 0))


# ----------------------------------------------------------------- the rules
def _broadcast(node: cg.Node, shapes: Shapes, i: int, a: int) -> Shapes | str:
    """Inputs aligned from the right, NumPy-style: the axis empties in every input
    where it is not a broadcast 1 (a unary op's axis just empties)."""
    pos = a - len(shapes[i])
    return _zero(
        shapes, [(j, len(s) + pos) for j, s in enumerate(shapes) if len(s) >= -pos and (j == i or s[pos] != 1)]
    )


def _tied(letters: Callable[[cg.Node, Shapes], list[str]], reasons: dict[str, str] | None = None) -> Rule:
    """A rule from one letter per axis of each input (einsum-style): an axis empties
    with every axis of the same letter; a letter in ``reasons`` cannot be empty."""

    def rule(node: cg.Node, shapes: Shapes, i: int, a: int) -> Shapes | str:
        names = letters(node, shapes)
        letter = names[i][a]
        if reasons and letter in reasons:
            return reasons[letter]
        return _zero(shapes, [(j, b) for j, word in enumerate(names) for b, c in enumerate(word) if c == letter])

    return rule


def _matmul(node: cg.Node, shapes: Shapes) -> list[str]:
    return ["km" if node.attrs["transpose_a"] else "mk", "nk" if node.attrs["transpose_b"] else "kn"]


def _batch_matmul(node: cg.Node, shapes: Shapes, i: int, a: int) -> Shapes | str:
    """Batch dims broadcast (aligned from the right, as ``_broadcast``); matrix dims tie as MatMul's."""
    batch = [s[:-2] for s in shapes]
    if a < len(batch[i]):
        pos = a - len(batch[i])
        tied = [(j, len(b) + pos) for j, b in enumerate(batch) if len(b) >= -pos and (j == i or b[pos] != 1)]
        return _zero(shapes, tied)
    # "." marks a batch dim: never the letter of the matrix axis being emptied.
    return _tied(lambda n, s: ["." * len(b) + w for b, w in zip(batch, _matmul(n, s))])(node, shapes, i, a)


def _batch_norm(node: cg.Node, shapes: Shapes) -> list[str]:
    # x (and dy) by letter; every per-channel input is the channel axis's letter.
    x = "abcdefgh"[: len(shapes[1 if node.op == "BatchNormGrad" else 0])]
    channel = x[node.attrs["channel_axis"]]
    return [x if len(s) == len(x) else channel for s in shapes]


def _broadcast_like(node: cg.Node, shapes: Shapes) -> list[str]:
    like = "abcdefgh"[: len(shapes[1])]
    axes, keep = node.attrs["axes"], node.attrs["keepdims"]
    return [like if keep else "".join(c for b, c in enumerate(like) if b not in axes), like]


def _concat(node: cg.Node, shapes: Shapes) -> list[str]:
    # Every piece has its own size along the axis (upper case: one letter each).
    axis = node.attrs["axis"]
    if len(shapes[0]) < len(node.specs[0].shape):  # a stack: the inputs gain the axis and share every other
        return ["abcdefgh"[: len(s)] for s in shapes]
    return ["".join("ABCDEFGH"[j] if b == axis else "abcdefgh"[b] for b in range(len(s))) for j, s in enumerate(shapes)]


def _split_like(node: cg.Node, shapes: Shapes, i: int, a: int) -> Shapes | str:
    axis = node.attrs["axis"]
    if a != axis:
        return _zero(shapes, [(j, a) for j in range(len(shapes))])
    if i == 0:  # no gradient to split: every piece is empty
        return _zero(shapes, [(j, axis) for j in range(len(shapes))])
    return _set(shapes, {(i, axis): 0, (0, axis): shapes[0][axis] - shapes[i][axis]})


def _reshape_like(node: cg.Node, shapes: Shapes, i: int, a: int) -> Shapes | str:
    if node.attrs.get("same_shape"):  # one shape: the same axis of both is empty
        return _zero(shapes, [(0, a), (1, a)])
    return _zero(shapes, [(i, a), (1 - i, 0)])  # both hold no elements


def _reshape(node: cg.Node, shapes: Shapes, i: int, a: int) -> Shapes | str:
    target = node.attrs["shape"]
    if -1 not in target and math.prod(target) > 0:
        return f"the target shape {target} needs {math.prod(target)} element(s); an empty input has none"
    return _broadcast(node, shapes, i, a)


def _squeeze(node: cg.Node, shapes: Shapes, i: int, a: int) -> Shapes | str:
    if a in node.attrs["axes"]:
        return "the row squeezes this axis away, which only a size-1 axis allows"
    return _broadcast(node, shapes, i, a)


def _slice(node: cg.Node, shapes: Shapes, i: int, a: int) -> Shapes | str:
    begin, size = node.attrs["begin"][a], node.attrs["size"][a]
    if begin != 0 or size not in (0, -1):
        return f"the row slices [{begin}:{'' if size == -1 else begin + size}] of this axis, past an empty axis's end"
    return _broadcast(node, shapes, i, a)


def _indexed_axes(attrs: dict[str, Any]) -> set[int]:
    """The input axes a StridedSlice picks one element of (an int in its key)."""
    picked, axis = set(), 0
    for item in _index(attrs):
        if item is None:
            continue
        if not isinstance(item, slice):
            picked.add(axis)
        axis += 1
    return picked


def _strided_slice(node: cg.Node, shapes: Shapes, i: int, a: int) -> Shapes | str:
    if a in _indexed_axes(node.attrs):
        return f"the row's index {_index(node.attrs)} picks one element of this axis: an empty axis has none"
    return _broadcast(node, shapes, i, a)


def _strided_slice_grad(node: cg.Node, shapes: Shapes, i: int, a: int) -> Shapes | str:
    # The gradient is the slice of the input (input 1): empty that, and slice it again.
    if _indexed_axes(node.attrs):
        return f"the row's index {_index(node.attrs)} picks single elements: an empty axis has none"
    like = _zero(shapes, [(1, a)])[1]
    return (np.zeros(like)[_index(node.attrs)].shape, like)


def _spatial(node: cg.Node, *letters: str) -> dict[str, str]:
    """Reasons for the axes of a convolution or pool that cannot be empty."""
    reasons = {c: "a filter window must hold at least one element" for c in "kl"}
    if node.attrs["padding"] == "VALID":
        reasons.update(dict.fromkeys(letters, "a VALID window must fit inside the input: an empty axis fits none"))
    elif not isinstance(node.attrs["padding"], str):
        reasons.update(dict.fromkeys(letters, "a window must fit inside the explicitly padded input"))
    return reasons


def _conv(node: cg.Node, shapes: Shapes, i: int, a: int) -> Shapes | str:
    # x (N, H, W, C), filter (KH, KW, C, O), dy (N, OH, OW, O): OH is 0 exactly when H is (SAME).
    return _tied(lambda n, s: ["nhwc", "klco", "nhwo"][: len(s)], _spatial(node, "h", "w"))(node, shapes, i, a)


def _pool(node: cg.Node, shapes: Shapes, i: int, a: int) -> Shapes | str:
    reasons = _spatial(node, "h", "w")
    if "nhwc"[a] in reasons:
        return reasons["nhwc"[a]]
    return _broadcast(node, shapes, i, a)  # x and dy (or ddx) align axis by axis


def _gather(node: cg.Node, shapes: Shapes) -> list[str]:
    # Params' gathered axis empties alone: indices into it are an error the op documents.
    return ["abcdefgh"[: len(shapes[0])], "pqrs"[: len(shapes[1])]]


def _scatter_add_like(node: cg.Node, shapes: Shapes) -> list[str]:
    axis, like = node.attrs["axis"], "abcdefgh"[: len(shapes[2])]
    ids = "pqrs"[: len(shapes[1])]
    return [like[:axis] + ids + like[axis + 1 :], ids, like]


def _split(node: cg.Node, shapes: Shapes, i: int, a: int) -> Shapes | str:
    sizes = node.attrs["sizes"]
    if a == node.attrs["axis"] and sum(s for s in sizes if s != -1):
        return f"the row splits this axis into pieces of sizes {sizes}: an empty axis holds none of them"
    return _broadcast(node, shapes, i, a)  # a count of pieces splits 0 into empty pieces


def _broadcast_to(node: cg.Node, shapes: Shapes, i: int, a: int) -> Shapes | str:
    target = node.attrs["shape"]
    size = target[len(target) - len(shapes[i]) + a]
    if size != 0:
        return f"the row broadcasts this axis to {size}: an empty axis broadcasts to nothing but 0"
    return _zero(shapes, [(i, a)])


_DEPTH = {"K": "the row's indices hold this many coordinates per row: emptying it changes what they index"}
_FIXED = dict.fromkeys("WXYZ", "the row's shape attr fixes this dim of the output, and updates must match it")


def _gather_nd(node: cg.Node, shapes: Shapes) -> list[str]:
    # Params' indexed axes empty alone: coordinates into them are an error the op documents.
    return ["abcdefgh"[: len(shapes[0])], "pqrs"[: len(shapes[1]) - 1] + "K"]


def _scatter_nd(node: cg.Node, shapes: Shapes) -> list[str]:
    rows, depth = "pqrs"[: len(shapes[0]) - 1], shapes[0][-1]
    if node.op == "ScatterNdLike":
        like = "abcdefgh"[: len(shapes[2])]
        return [rows + "K", rows + like[depth:], like]
    if node.op == "TensorScatterReduce":  # (tensor, indices, updates)
        rows, depth = "pqrs"[: len(shapes[1]) - 1], shapes[1][-1]
        data = "abcdefgh"[: len(shapes[0])]
        return [data, rows + "K", rows + data[depth:]]
    return [rows + "K", rows + "WXYZ"[: len(shapes[1]) - len(rows)]]


def _batch_gather(node: cg.Node, shapes: Shapes) -> list[str]:
    # Batch dims shared; the gathered axis of params empties alone (its indices are then an error).
    b, axis = node.attrs["batch_dims"], node.attrs["axis"]
    like = "abcdefgh"[: len(shapes[2 if node.op == "BatchGatherGrad" else 0])]
    ids = like[:b] + "pqrs"[: len(shapes[1]) - b]
    return [like, ids] if node.op == "BatchGather" else [like[:axis] + ids[b:] + like[axis + 1 :], ids, like]


def _mirror_pad(node: cg.Node, shapes: Shapes, i: int, a: int) -> Shapes | str:
    if any(node.attrs["paddings"][a]):
        return f"the row mirrors {node.attrs['paddings'][a]} elements of this axis: an empty axis has none to mirror"
    return _broadcast(node, shapes, i, a)


def _top_k(node: cg.Node, shapes: Shapes, i: int, a: int) -> Shapes | str:
    if a == len(shapes[i]) - 1 and node.attrs["k"]:
        return f"k = {node.attrs['k']} entries cannot come from an empty last axis: refused (test_top_k.py)"
    return _broadcast(node, shapes, i, a)


RULES: dict[str, Rule] = {
    "MatMul":             _tied(_matmul),
    "BatchMatMul":        _batch_matmul,
    "FusedBatchNorm":     _tied(_batch_norm),
    "BatchNormGrad":      _tied(_batch_norm),
    "BroadcastLike":      _tied(_broadcast_like),
    "Concat":             _tied(_concat),
    "SplitLike":          _split_like,
    "ReshapeLike":        _reshape_like,
    "Reshape":            _reshape,
    "Squeeze":            _squeeze,
    "Slice":              _slice,
    "StridedSlice":       _strided_slice,
    "StridedSliceGrad":   _strided_slice_grad,
    "Gather":             _tied(_gather),
    "ScatterAddLike":     _tied(_scatter_add_like),
    "SparseSoftmaxCrossEntropyWithLogits": _tied(lambda n, s: ["nc", "n"]),
    "Conv2D":             _conv,
    "Conv2DBackpropInput": _conv,
    "Conv2DBackpropFilter": _conv,
    "Conv2DTranspose":    _tied(lambda n, s: ["nhwo", "klco"], {
        **dict.fromkeys("hw", "the output size must convolve back to the input's: an empty input pins no size"),
        **dict.fromkeys("kl", "a filter window must hold at least one element"),
    }),
    "MaxPool":            _pool,
    "MaxPoolWithArgmax":  _pool,
    "AvgPool":            _pool,
    "MaxPoolGrad":        _pool,
    "MaxPoolGradGrad":    _pool,
    "AvgPoolGrad":        _pool,
    "Split":              _split,
    "TileGrad":           _tied(lambda n, s: ["abcdefgh"[: len(s[1])]] * 2),
    "BroadcastTo":        _broadcast_to,
    "GatherNd":           _tied(_gather_nd, _DEPTH),
    "ScatterNd":          _tied(_scatter_nd, {**_DEPTH, **_FIXED}),
    "ScatterNdLike":      _tied(_scatter_nd, _DEPTH),
    "BatchGather":        _tied(_batch_gather),
    "BatchGatherGrad":    _tied(_batch_gather),
    "TensorScatterReduce": _tied(_scatter_nd, _DEPTH),
    "MirrorPad":          _mirror_pad,
    "MirrorPadGrad":      _mirror_pad,
    "TopK":               _top_k,
}  # fmt: skip

# Rows with no variant, and why.
NO_VARIANT = {
    "Const": "no inputs: the value is built into the row; test_an_empty_constant checks an empty one",
    "Relu-rank0": "its one input is rank 0: no axis to empty",
    "Erf-rank0": "its one input is rank 0: no axis to empty",
    "Concat-stack-scalars": "its inputs are rank 0: no axis to empty",
    "Tile-rank0": "its one input is rank 0: no axis to empty",
    "BroadcastTo-scalar": "its one input is rank 0: no axis to empty",
    "Shape-rank0": "its one input is rank 0: no axis to empty",
}
# Ops whose every operand is a scalar, and why that is enough.
SCALAR_OPERANDS = {
    "Range": "start, limit and delta are scalars: no axis to empty; the op table's Range-empty-int64 row "
    "gives an empty range",
    "LearningRateSchedule": "its one operand is the global step, a scalar: no axis to empty",
}
# The words of the error an op documents for inputs its reference rejects.
ERROR_WORDS = {
    "ArgMax": "argmax over an empty axis",
    "ArgMin": "argmin over an empty axis",
    "Gather": "is out of range [0, 0)",
    "ScatterAddLike": "is out of range [0, 0)",
    "GatherNd": "does not index into params",
    "ScatterNdLike": "does not index into output",
    "BatchGather": "is out of range [0, 0)",
    "TensorScatterReduce": "does not index into tensor",
    "BatchGatherGrad": "is out of range [0, 0)",
    "SparseSoftmaxCrossEntropyWithLogits": "is outside the valid range [0, 0)",
}
# Ops whose CUDA kernel answers such inputs with NaN instead, and why.
CUDA_NAN_INSTEAD = {
    "SparseSoftmaxCrossEntropyWithLogits": "a label outside [0, classes) gives NaN in its row, as TensorFlow's "
    "GPU kernel does: raising would need the labels on the host",
}


# -------------------------------------------------------------- the variants
@dataclasses.dataclass(frozen=True)
class Variant:
    row: str
    emptied: str  # e.g. "in0-axis1": input 0, axis 1 (and whatever the op ties to it)
    case: OpCase

    @property
    def label(self) -> str:
        return f"{self.row}/{self.emptied}"


def _emptied_case(case: OpCase, shapes: Shapes) -> OpCase:
    """``case`` with each input cut down to ``shapes`` (its leading elements)."""
    inputs = [np.array(x[tuple(slice(0, n) for n in shape)]) for x, shape in zip(case.inputs, shapes)]
    static = None
    if case.static_shapes:
        static = [
            tuple(None if s is None else n for s, n in zip(dims, shape))
            for dims, shape in zip(case.static_shapes, shapes)
        ]
    return dataclasses.replace(case, inputs=inputs, static_shapes=static)


def _variants() -> tuple[list[Variant], dict[str, str]]:
    variants, reasons = [], {}
    for case in CASES:
        node = _node(case)
        rule = RULES.get(node.op, _broadcast)
        shapes = tuple(x.shape for x in case.inputs)
        seen: set[Shapes] = set()
        for i, shape in enumerate(shapes):
            for a in range(len(shape)):
                emptied = f"in{i}-axis{a}"
                result = rule(node, shapes, i, a)
                if isinstance(result, str):
                    reasons[f"{case.label}/{emptied}"] = result
                elif result not in seen:
                    seen.add(result)
                    variants.append(Variant(case.label, emptied, _emptied_case(case, result)))
    return variants, reasons


VARIANTS, NOT_EMPTIED = _variants()


def test_every_row_has_a_variant_or_a_reason() -> None:
    rows = {v.row for v in VARIANTS}
    # A row with no variant had a reason for every axis it has, or has none (NO_VARIANT says why).
    reasoned = {label.split("/")[0] for label in NOT_EMPTIED}
    for case in CASES:
        scalar = case.op in SCALAR_OPERANDS
        assert case.label in rows or case.label in reasoned or case.label in NO_VARIANT or scalar, case.label
        assert not (case.label in rows and case.label in NO_VARIANT), f"{case.label} has variants now"


def test_every_op_has_a_size_zero_variant_or_a_reason() -> None:
    covered = {case.op for case in CASES if case.label in {v.row for v in VARIANTS}}
    without = {**NO_ROW, "Const": NO_VARIANT["Const"], **SCALAR_OPERANDS}
    missing = [op for op in OPS if op not in covered and op not in without]
    assert not missing, f"ops with no size-0 variant and no reason: {missing}"


# ------------------------------------------------------------------ checking
def _reference(node: cg.Node, args: list[np.ndarray]) -> list[np.ndarray] | Exception:
    """The reference's outputs, or the error it raises for these inputs."""
    try:
        return _outputs(node.opdef.reference(node.attrs, *[x.copy() for x in args]))
    except (ValueError, IndexError) as err:
        return err


def _check(got: list[np.ndarray], expected: list[np.ndarray], node: cg.Node, where: str) -> None:
    assert len(got) == len(expected) == len(node.specs)
    for value, want, spec in zip(got, expected, node.specs):
        assert value.dtype == want.dtype == np.dtype(spec.dtype), (where, value.dtype, want.dtype, spec.dtype)
        assert value.shape == want.shape, (where, value.shape, want.shape)
        assert all(s is None or s == d for s, d in zip(spec.shape, value.shape)), (where, spec.shape, value.shape)
        np.testing.assert_array_equal(value, want, err_msg=where) if value.dtype.kind in "biu" else (
            np.testing.assert_allclose(value, want, rtol=1e-5, atol=1e-6, err_msg=where)
        )


FUSE = pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])


@FUSE
@pytest.mark.parametrize("variant", VARIANTS, ids=[v.label for v in VARIANTS])
def test_session_matches_reference(variant: Variant, fuse: bool) -> None:
    g, tensors, out, feeds, inputs = _build(variant.case)
    node = out if isinstance(out, cg.Node) else out.node
    expected = _reference(node, _node_inputs(node, tensors, inputs))
    sess = cg.Session(g, fuse=fuse)
    if isinstance(expected, Exception):
        with pytest.raises(cg.ExecutionError) as caught:
            sess.run(node.outputs, feeds)
        assert str(caught.value).startswith(f"{node.describe()} failed while running: ")
        assert ERROR_WORDS[node.op] in str(caught.value)
        return
    _check(sess.run(node.outputs, feeds), expected, node, "session")


SIMULATED = [v for v in VARIANTS if v.row not in TOO_BIG_FOR_SIMULATOR]
COLUMN = SIMULATED if cuda_simulator() else VARIANTS


@pytest.mark.cuda
@pytest.mark.parametrize("variant", COLUMN, ids=[v.label for v in COLUMN])
def test_cuda_kernel_matches_reference(variant: Variant) -> None:
    from numba import cuda

    g, tensors, out, feeds, inputs = _build(variant.case)
    node = out if isinstance(out, cg.Node) else out.node
    args = _node_inputs(node, tensors, inputs)
    expected = _reference(node, args)
    kernel = node.opdef.kernels["cuda"](node, KernelContext(VariableStore()))
    device_args = [cuda.to_device(np.array(x, order="C")) for x in args]
    if isinstance(expected, Exception) and node.op not in CUDA_NAN_INSTEAD:
        with pytest.raises((ValueError, IndexError), match=re.escape(ERROR_WORDS[node.op])):
            kernel(*device_args)
        return
    result = kernel(*device_args)
    got = [r.copy_to_host() for r in (result if isinstance(result, tuple) else (result,))]
    if isinstance(expected, Exception):
        nans = [np.full(value.shape, np.nan, spec.dtype) for value, spec in zip(got, node.specs)]
        _check(got, nans, node, "cuda kernel (NaN rows)")
        return
    _check(got, expected, node, "cuda kernel")


def test_an_empty_constant() -> None:
    g = cg.Graph()
    with g.as_default():
        c = cg.constant(np.zeros((2, 0), np.float32))
    for fuse in (True, False):
        value = cg.Session(g, fuse=fuse).run(c)
        assert value.shape == (2, 0) and value.dtype == np.float32


def op_halves(node_ids: list[str]) -> list[list[str]]:
    """``node_ids`` in two groups of about equal size, every test of one op in the same group (its kernels then
    compile in one process only)."""
    by_op: dict[str, list[str]] = {}
    for node in node_ids:
        by_op.setdefault(re.split(r"[-/\]]", node.partition("[")[2], maxsplit=1)[0], []).append(node)
    halves: list[list[str]] = [[], []]
    for _, nodes in sorted(by_op.items(), key=lambda item: -len(item[1])):
        min(halves, key=len).extend(nodes)
    return [[n for n in node_ids if n in set(half)] for half in halves]


def test_op_halves_keep_each_ops_tests_together_and_lose_none() -> None:
    nodes = ["t.py::a", "t.py::s[Add/in0-axis0-fused]", "t.py::s[Mul-x/in0]", "t.py::s[Add/in1-axis0-fused]"]
    assert op_halves(nodes) == [
        ["t.py::s[Add/in0-axis0-fused]", "t.py::s[Add/in1-axis0-fused]"],
        ["t.py::a", "t.py::s[Mul-x/in0]"],
    ]


@pytest.mark.slow
def test_cpu_kernels_read_nothing_outside_their_inputs(tmp_path: Path) -> None:
    """Numba does not check bounds, so a kernel that reads the first element of an
    empty axis gets whatever memory lies there, and may still match the reference
    (a softmax row of no elements). This table runs again with bounds checked; in
    a fresh cache, since cached machine code was compiled without the checks. It
    compiles every kernel again: two processes side by side, each with half the ops."""
    env = {**os.environ, "NUMBA_BOUNDSCHECK": "1", "NUMBA_CACHE_DIR": str(tmp_path)}
    pytest_line = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not cuda and not slow"]
    root = Path(__file__).resolve().parents[2]
    collected = subprocess.run(
        [*pytest_line, "--collect-only", __file__], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )
    node_ids = [line for line in collected.stdout.splitlines() if "::" in line and not line.startswith(" ")]
    assert len(node_ids) > 1000, collected.stdout[-3000:] + collected.stderr[-2000:]
    procs = [
        subprocess.Popen(
            [*pytest_line, *half], cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for half in op_halves(node_ids)
    ]
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=900)
            assert proc.returncode == 0, out[-6000:] + err[-2000:]
            assert re.search(r"\d+ passed", out.strip().splitlines()[-1]), out[-2000:]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
