"""The ops and Python operators issue 16's "Build" list names are all reachable
from the public API: a removed or renamed one fails here by name."""

from __future__ import annotations

import numpy as np
import pytest

import cellgraph as cg

# Where each name lives: cg.<name>, cg.nn.<name> or cg.losses.<name>.
NAMES = {
    "cg": """abs sign floor ceil round sin cos tan rsqrt log1p expm1 erf floordiv mod clip_by_value where greater
        greater_equal less_equal not_equal logical_and logical_or logical_not logical_xor is_nan is_finite
        stop_gradient reduce_min reduce_prod reduce_logsumexp reduce_any reduce_all argmin argmax cumsum cumprod
        top_k moments matmul einsum stack unstack split tile broadcast_to reverse gather gather_nd scatter_nd range
        shape size pad space_to_depth depth_to_space resize batch_norm layer_norm conv2d conv1d conv2d_transpose
        max_pool leaky_relu elu selu gelu softplus softsign silu relu6 hard_sigmoid placeholder_with_default
        dropout""",
    "nn": "depthwise_conv2d max_pool_with_argmax conv2d conv1d conv2d_transpose space_to_depth depth_to_space",
    "losses": """sigmoid_cross_entropy_with_logits softmax_cross_entropy_with_logits sparse_softmax_cross_entropy
        l2_loss huber""",
}
MODULES = {"cg": cg, "nn": cg.nn, "losses": cg.losses}


@pytest.mark.parametrize(("where", "name"), [(w, n) for w, names in NAMES.items() for n in names.split()])
def test_the_issue_16_op_is_public(where: str, name: str) -> None:
    assert callable(getattr(MODULES[where], name, None)), f"{where}.{name} is missing"


def test_argmax_and_argmin_take_keepdims_and_output_type() -> None:
    x = cg.constant(np.array([[1.0, 3.0, 2.0], [5.0, 4.0, 6.0]], np.float32))
    top = cg.argmax(x, axis=1, keepdims=True, output_type="int64")
    low = cg.argmin(x, axis=0, output_type="int32")
    got_top, got_low = cg.Session().run([top, low])
    assert got_top.dtype == np.int64 and got_low.dtype == np.int32
    np.testing.assert_array_equal(got_top, [[1], [2]])
    np.testing.assert_array_equal(got_low, [0, 0, 0])


def test_the_python_operators_the_issue_names() -> None:
    x = cg.constant(np.array([-2.0, 3.0], np.float32))
    b = cg.constant(np.array([True, False]))
    c = cg.constant(np.array([True, True]))
    results = cg.Session().run(
        [2.0**x, x**2, abs(x), x < 0, x <= 3, x > 0, x >= 3, x // 2, x % 2, b & c, b | c, ~b, b ^ c]
    )
    want = [
        [0.25, 8.0], [4.0, 9.0], [2.0, 3.0], [True, False], [True, True], [False, True], [False, True],
        [-1.0, 1.0], [0.0, 1.0], [True, False], [True, True], [False, True], [False, True],
    ]  # fmt: skip
    for got, expected in zip(results, want):
        np.testing.assert_array_equal(got, expected)
