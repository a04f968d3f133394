"""Every error the array family raises, with the words a user reads."""

from __future__ import annotations

import numpy as np
import pytest

import cellgraph as cg
from cellgraph.dataflow.opdef import OPS, not_differentiable
from cellgraph.dataflow.ops import array, array_gather, array_slice

from .errors_helpers import ph, raises

pytestmark = pytest.mark.usefixtures("fresh_graph")


# ------------------------------------------------------------------ Reshape
def test_reshape_names_the_node_and_both_shapes() -> None:
    with pytest.raises(cg.ShapeError, match=r"^Reshape 'flat' \(test_array_errors\.py:\d+\): cannot reshape \(2, 3\)"):
        cg.reshape(ph(2, 3), (4, 2), name="flat")


def test_reshape_element_counts_differ() -> None:
    with raises(cg.ShapeError, "cannot reshape (2, 3) to (4, 2): 6 elements do not fit in 8"):
        cg.reshape(ph(2, 3), (4, 2))


def test_reshape_minus_one_does_not_divide() -> None:
    with raises(cg.ShapeError, "cannot reshape (2, 3) to (4, -1): 6 is not divisible by 4"):
        cg.reshape(ph(2, 3), (4, -1))


def test_reshape_unknown_batch_to_a_size_no_batch_can_fill() -> None:
    with raises(cg.ShapeError, "cannot reshape (None, 64) to (10, 10): 100 is not a multiple of 64"):
        cg.reshape(ph(None, 64), (10, 10))


def test_reshape_unknown_batch_with_minus_one_is_left_to_run_time() -> None:
    # (None, 64) -> (10, -1) fits any batch that is a multiple of 5 (5 * 64 = 10 * 32).
    assert cg.reshape(ph(None, 64), (10, -1)).shape == (10, None)


def test_reshape_two_minus_ones() -> None:
    with raises(cg.ShapeError, "cannot reshape (2, 3) to (-1, -1): only one dim can be -1"):
        cg.reshape(ph(2, 3), (None, -1))


def test_reshape_negative_dim() -> None:
    with raises(cg.ShapeError, "cannot reshape (2, 3) to (-2, -3): dims must be >= 0, or -1 for the one to infer"):
        cg.reshape(ph(2, 3), (-2, -3))


def test_reshape_shape_must_be_ints() -> None:
    with raises(cg.ShapeError, "reshape: shape must be a sequence of ints, got"):
        cg.reshape(ph(2, 3), (2.0, 3))


def test_reshape_like_counts_differ() -> None:
    with raises(cg.ShapeError, "ReshapeLike 'reshape_like' (test_array_errors.py"):
        array.reshape_like(ph(2, 3), ph(4, 2, name="like"))
    with raises(cg.ShapeError, "cannot reshape (2, 3) like (4, 2): 6 elements vs 8"):
        array.reshape_like(ph(2, 3), ph(4, 2, name="like"))


def test_same_shape_reshape_like_refuses_a_transposed_array_of_the_same_size() -> None:
    """A (batch, time) mask fed as (time, batch) passed the size check and was read in the wrong order."""
    with raises(cg.ShapeError, "ReshapeLike 'reshape_like' (test_array_errors.py"):
        array.reshape_like(ph(2, 3), ph(3, 2, name="like"), same_shape=True)
    with raises(cg.ShapeError, "(2, None) must have the shape of (3, None)"):
        array.reshape_like(ph(2, None), ph(3, None, name="like"), same_shape=True)
    x, like = ph(None, None, name="mask"), ph(None, None, name="rows")
    y = array.reshape_like(x, like, name="mask_like_x", same_shape=True)
    sess = cg.Session()
    good = np.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(sess.run(y, {x: good, like: np.zeros((2, 3))}), good)
    for _ in range(2):  # refused after a good run too (the check remembers only shapes that passed)
        with pytest.raises(cg.ExecutionError) as err:
            sess.run(y, {x: good.T, like: np.zeros((2, 3))})
        assert str(err.value).startswith("ReshapeLike 'mask_like_x' (test_array_errors.py")
        assert str(err.value).endswith(
            "ValueError: 'mask:0' has shape (3, 2) but must have the shape of 'rows:0', (2, 3)"
        )
    # A plain ReshapeLike (a gradient's) still reshapes any array of the size.
    plain = array.reshape_like(x, like)
    np.testing.assert_array_equal(sess.run(plain, {x: good.T, like: np.zeros((2, 3))}), good.T.reshape(2, 3))


def test_reshape_to_a_wrong_size_at_run_time_names_the_node() -> None:
    x = ph(None, 4)
    y = cg.reshape(x, (3, 4), name="to_three_rows")
    with pytest.raises(cg.ExecutionError, match=r"Reshape 'to_three_rows' .* failed while running: ValueError"):
        cg.Session().run(y, {x: np.zeros((2, 4))})


# -------------------------------------------------------- ExpandDims, Squeeze
def test_expand_dims_axis_out_of_range() -> None:
    with raises(cg.ShapeError, "axes (5,) are out of range or repeated for (2, 3) made rank 3"):
        cg.expand_dims(ph(2, 3), 5)


def test_expand_dims_repeated_axis() -> None:
    with raises(cg.ShapeError, "axes (1, 1) are out of range or repeated for (2, 3) made rank 4"):
        cg.expand_dims(ph(2, 3), (1, -3))


def test_expand_dims_axis_must_be_ints() -> None:
    with raises(cg.ShapeError, "expand_dims: axis must be a sequence of ints, got"):
        cg.expand_dims(ph(2, 3), (0.5,))


def test_squeeze_a_dim_that_is_not_one() -> None:
    with raises(cg.ShapeError, "cannot squeeze axis 0 of (2, 1): its size is 2, not 1"):
        cg.squeeze(ph(2, 1), 0)


def test_squeeze_axis_out_of_range() -> None:
    with raises(cg.ShapeError, "axis 4 is out of range for (2, 1)"):
        cg.squeeze(ph(2, 1), 4)


def test_squeeze_all_with_unknown_dims_asks_for_axis() -> None:
    message = "squeeze of 'x:0' (None, 1): which unknown dims are 1 is not known until the graph runs; pass axis="
    with raises(cg.ShapeError, message):
        cg.squeeze(ph(None, 1))


def test_squeeze_axis_must_be_ints() -> None:
    with raises(cg.ShapeError, "squeeze: axis must be a sequence of ints, got"):
        cg.squeeze(ph(2, 1), ("1",))


# ---------------------------------------------------------------- Transpose
def test_transpose_perm_of_the_wrong_length() -> None:
    with raises(cg.ShapeError, "perm (0, 2) does not match rank 3 of (2, 3, 4)"):
        cg.transpose(ph(2, 3, 4), (0, 2))


def test_transpose_perm_that_is_not_a_permutation() -> None:
    with raises(cg.ShapeError, "perm (0, 0, 1) is not a permutation of (0, 1, 2)"):
        cg.transpose(ph(2, 3, 4), (0, 0, 1))


def test_transpose_perm_must_be_ints() -> None:
    with raises(cg.ShapeError, "transpose: perm must be a sequence of ints, got"):
        cg.transpose(ph(2, 3), "ab")


# ------------------------------------------------------ Concat, SplitLike
def test_concat_inputs_differ_off_the_axis() -> None:
    a, b = ph(None, 8, 8, 16, name="a"), ph(None, 8, 4, 16, name="b")
    with pytest.raises(cg.ShapeError, match=r"^Concat 'mixed' \(test_array_errors\.py:\d+\): inputs differ on axis 2"):
        cg.concat([a, b], axis=3, name="mixed")
    with raises(cg.ShapeError, "inputs differ on axis 2: (None, 8, 8, 16) and (None, 8, 4, 16)"):
        cg.concat([a, b], axis=3)


def test_concat_names_the_input_that_fixed_the_dim() -> None:
    a, b, c = ph(None, 2, name="a"), ph(3, 2, name="b"), ph(4, 2, name="c")
    with raises(cg.ShapeError, "inputs differ on axis 0: (3, 2) and (4, 2)"):
        cg.concat([a, b, c], axis=1)


def test_concat_ranks_differ() -> None:
    with raises(cg.ShapeError, "inputs differ in rank: (2, 3) and (2, 3, 1)"):
        cg.concat([ph(2, 3, name="a"), ph(2, 3, 1, name="b")], axis=1)


def test_concat_dtypes_differ() -> None:
    with raises(cg.DTypeError, "inputs have different dtypes: float32 and int32"):
        cg.concat([ph(2, 3, name="a"), ph(2, 3, dtype="int32", name="b")], axis=1)


def test_concat_axis_out_of_range() -> None:
    with raises(cg.ShapeError, "axis 2 is out of range for (2, 3)"):
        cg.concat([ph(2, 3, name="a"), ph(2, 3, name="b")], axis=2)
    with raises(cg.ShapeError, "axis -3 is out of range for (2, 3)"):
        cg.concat([ph(2, 3, name="a"), ph(2, 3, name="b")], axis=-3)


def test_concat_of_nothing() -> None:
    with raises(cg.ShapeError, "concat needs at least one tensor, got none"):
        cg.concat([], axis=0)


def test_concat_of_scalars() -> None:
    with raises(cg.ShapeError, "concat cannot join scalars: 'x:0' has shape ()"):
        cg.concat([ph(), ph(name="y")], axis=0)


def test_split_like_piece_that_differs_off_the_axis() -> None:
    with raises(cg.ShapeError, "cannot split (2, 5) on axis 1 into a piece like (3, 2)"):
        array._split_like(ph(2, 5, name="g"), [ph(3, 2, name="a"), ph(2, 3, name="b")], 1)


def test_split_like_pieces_that_do_not_add_up() -> None:
    with raises(cg.ShapeError, "pieces of sizes (2, 2) do not add up to (2, 5) on axis 1"):
        array._split_like(ph(2, 5, name="g"), [ph(2, 2, name="a"), ph(2, 2, name="b")], 1)


def test_split_like_pieces_that_do_not_add_up_at_run_time() -> None:
    g, a, b = ph(2, None, name="g"), ph(2, None, name="a"), ph(2, None, name="b")
    first = array._split_like(g, [a, b], 1)[0]
    assert first is not None
    feeds = {g: np.zeros((2, 5)), a: np.zeros((2, 2)), b: np.zeros((2, 2))}
    with raises(
        cg.ExecutionError, "failed while running: ValueError: pieces of sizes (2, 2) do not add up to 5 on axis 1"
    ):
        cg.Session().run(first, feeds)


# ----------------------------------------------------------------- Slice
def test_slice_begin_and_size_per_dim() -> None:
    with raises(cg.ShapeError, "begin (0,) and size (1, 1) need one entry per dim of (2, 3)"):
        cg.slice(ph(2, 3), (0,), (1, 1))


def test_slice_negative_begin_or_size() -> None:
    with raises(cg.ShapeError, "begin (-1, 0) must be >= 0 and size (1, -2) >= -1 (to the end)"):
        cg.slice(ph(2, 3), (-1, 0), (1, -2))


def test_slice_out_of_bounds() -> None:
    with raises(cg.ShapeError, "begin (0, 2) size (1, 2) is out of bounds for (2, 3) on axis 1"):
        cg.slice(ph(2, 3), (0, 2), (1, 2))
    with raises(cg.ShapeError, "begin (3, 0) size (-1, 1) is out of bounds for (2, 3) on axis 0"):
        cg.slice(ph(2, 3), (3, 0), (-1, 1))


def test_slice_out_of_bounds_at_run_time_names_the_node() -> None:
    x = ph(None, 3)
    y = cg.slice(x, (1, 0), (4, -1), name="rows")
    message = "Slice 'rows' (test_array_errors.py"
    with raises(cg.ExecutionError, message):
        cg.Session().run(y, {x: np.zeros((3, 3))})
    with raises(cg.ExecutionError, "IndexError: slice begin (1, 0) size (4, -1) is out of bounds for (3, 3) on axis 0"):
        cg.Session().run(y, {x: np.zeros((3, 3))})


def test_slice_begin_must_be_ints() -> None:
    with raises(cg.ShapeError, "slice: begin must be a sequence of ints, got"):
        cg.slice(ph(2, 3), 0, (1, 1))  # type: ignore[arg-type]
    with raises(cg.ShapeError, "slice: size must be a sequence of ints, got"):
        cg.slice(ph(2, 3), (0, 0), (1.5, 1))


# ------------------------------------------------------------------- Pad
def test_pad_pairs_per_dim() -> None:
    with raises(cg.ShapeError, "paddings ((1, 1),) need one (before, after) pair per dim of (2, 3)"):
        cg.pad(ph(2, 3), ((1, 1),))
    with raises(cg.ShapeError, "paddings ((1, 1), (1,)) need one (before, after) pair per dim of (2, 3)"):
        cg.pad(ph(2, 3), ((1, 1), (1,)))


def test_pad_negative() -> None:
    with raises(cg.ShapeError, "paddings ((0, 0), (1, -1)) must be >= 0"):
        cg.pad(ph(2, 3), ((0, 0), (1, -1)))


def test_pad_must_be_pairs_of_ints() -> None:
    with raises(
        cg.ShapeError, "pad: paddings must be one (before, after) pair of ints per dim, got ((0, 0), (1, 0.5))"
    ):
        cg.pad(ph(2, 3), ((0, 0), (1, 0.5)))
    with raises(cg.ShapeError, "pad: paddings must be one (before, after) pair of ints per dim, got (1, 1)"):
        cg.pad(ph(2, 3), (1, 1))


def test_pad_constant_must_be_a_scalar() -> None:
    with raises(cg.DTypeError, "pad: constant_values must be a bool, int or float scalar, got [1]"):
        cg.pad(ph(2, 3), ((0, 0), (1, 1)), constant_values=[1])
    assert cg.pad(ph(2, 3, name="y"), ((0, 0), (1, 1)), np.float32(2)).node.attrs["constant_values"] == 2.0


# ------------------------------------------------------- getitem (StridedSlice)
def test_index_out_of_range_for_a_known_dim() -> None:
    with pytest.raises(cg.ShapeError, match=r"^StridedSlice 'getitem' \(test_array_errors\.py:\d+\): index 3"):
        ph(2, 3)[:, 3]
    with raises(cg.ShapeError, "index 3 is out of range for axis 1 of (2, 3): [:, 3]"):
        ph(2, 3)[:, 3]
    with raises(cg.ShapeError, "index -3 is out of range for axis 0 of (2, 3): [-3, :]"):
        ph(2, 3)[-3]


def test_index_out_of_range_for_an_unknown_dim_fails_at_run_time() -> None:
    x = ph(None, 3)
    y = x[5]
    with raises(cg.ExecutionError, "StridedSlice 'getitem' (test_array_errors.py"):
        cg.Session().run(y, {x: np.zeros((2, 3))})


def test_too_many_indices() -> None:
    with raises(cg.ShapeError, "too many indices for (2, 3): [0, 1, 2]"):
        ph(2, 3)[0, 1, 2]
    with raises(cg.ShapeError, "too many indices for (2, 3): [0, None, 1:, ::2]"):
        ph(2, 3)[0, None, 1:, ::2]


def test_slice_step_zero() -> None:
    with raises(cg.ShapeError, "slice step cannot be zero: [:, 1::0]"):
        ph(2, 3)[:, 1::0]


@pytest.mark.parametrize(
    ("key", "what"),
    [
        ([0, 1], "list [0, 1]"),
        (1.5, "float 1.5"),
        (True, "bool True"),
        ("a", "str 'a'"),
        (np.array([0, 1]), "ndarray array([0, 1])"),
    ],
)
def test_unsupported_index_says_what_is_supported(key: object, what: str) -> None:
    message = (
        f"cannot index 'x:0' with {what}: indexing supports ints, slices (start:stop:step), ... (Ellipsis) "
        "and None (newaxis); for indices held in a tensor or a list use cg.gather"
    )
    with raises(cg.GraphError, message):
        ph(2, 3)[key]


def test_tensor_index_points_to_gather() -> None:
    i = ph(dtype="int32", name="i")
    with raises(cg.GraphError, "cannot index 'x:0' with tensor 'i:0': indexing supports ints"):
        ph(2, 3)[i]
    with raises(cg.GraphError, "use cg.gather"):
        ph(2, 3)[0, i]


def test_slice_bounds_must_be_ints() -> None:
    with raises(cg.GraphError, "cannot index 'x:0' with a slice bound float 0.5: slice bounds must be ints or None"):
        ph(2, 3)[0.5:]
    with raises(cg.GraphError, "with a slice bound tensor 'i:0'"):
        ph(2, 3)[: ph(dtype="int32", name="i")]


def test_two_ellipses() -> None:
    with raises(
        cg.GraphError, "cannot index 'x:0' with (Ellipsis, 0, Ellipsis): an index can have only one ... (Ellipsis)"
    ):
        ph(2, 3)[..., 0, ...]


def test_strided_slice_grad_that_does_not_fit() -> None:
    x = ph(4, 3)
    attrs = x[1:].node.attrs
    with raises(cg.ShapeError, "gradient (2, 3) does not fit [1:, :] of (4, 3)"):
        array_slice._strided_slice_grad(ph(2, 3, name="g"), x, attrs)


# ------------------------------------------------- Gather, ScatterAddLike, OneHot
def test_gather_indices_must_be_ints() -> None:
    with raises(cg.DTypeError, "Gather 'gather' (test_array_errors.py"):
        cg.gather(ph(5, 3), ph(2, name="i"))
    with raises(cg.DTypeError, "indices must be int32 or int64, got float32"):
        cg.gather(ph(5, 3), ph(2, name="i"))


def test_gather_axis_out_of_range() -> None:
    with raises(cg.ShapeError, "axis 2 is out of range for params (5, 3)"):
        cg.gather(ph(5, 3), [0, 1], axis=2)


def test_gather_index_out_of_range_at_run_time_names_node_index_and_size() -> None:
    params, ids = ph(5, 3, name="table"), ph(None, dtype="int32", name="ids")
    y = cg.gather(params, ids, name="lookup")
    sess = cg.Session()
    with pytest.raises(cg.ExecutionError, match=r"^Gather 'lookup' \(test_array_errors\.py:\d+\) failed while running"):
        sess.run(y, {params: np.zeros((5, 3)), ids: [0, 7, 1]})
    message = "IndexError: index 7 (at (1,) in indices) is out of range [0, 5) for axis 0 of params (5, 3)"
    with raises(cg.ExecutionError, message):
        sess.run(y, {params: np.zeros((5, 3)), ids: [0, 7, 1]})
    with raises(cg.ExecutionError, "index -1 (at (0,) in indices) is out of range [0, 5)"):
        sess.run(y, {params: np.zeros((5, 3)), ids: [-1]})


def test_scatter_add_updates_that_do_not_fit() -> None:
    with raises(cg.ShapeError, "updates (3, 2) do not fit indices (4,) into (5, 2) on axis 0"):
        array_gather._scatter_add_like(ph(3, 2, name="u"), ph(4, dtype="int32", name="i"), ph(5, 2, name="like"), 0)


def test_scatter_add_index_out_of_range_at_run_time() -> None:
    u, i, like = ph(2, 2, name="u"), ph(2, dtype="int32", name="i"), ph(None, 2, name="like")
    y = array_gather._scatter_add_like(u, i, like, 0)
    feeds = {u: np.ones((2, 2)), i: [0, 3], like: np.zeros((3, 2))}
    with raises(
        cg.ExecutionError, "IndexError: index 3 (at (1,) in indices) is out of range [0, 3) for axis 0 of output (3, 2)"
    ):
        cg.Session().run(y, feeds)


def test_one_hot_indices_must_be_ints() -> None:
    with raises(cg.DTypeError, "OneHot 'one_hot' (test_array_errors.py"):
        cg.one_hot(ph(3), 4)
    with raises(cg.DTypeError, "indices must be int32 or int64, got float32"):
        cg.one_hot(ph(3), 4)


def test_one_hot_negative_depth() -> None:
    with raises(cg.ShapeError, "depth must be >= 0, got -2"):
        cg.one_hot([0, 1], -2)


def test_one_hot_values_must_be_scalars() -> None:
    with raises(cg.DTypeError, "one_hot: on_value must be a bool, int or float scalar, got 'yes'"):
        cg.one_hot([0, 1], 2, on_value="yes")
    with raises(cg.DTypeError, "one_hot: off_value must be a bool, int or float scalar, got None"):
        cg.one_hot([0, 1], 2, off_value=None)


def test_one_hot_is_not_differentiable() -> None:
    assert OPS.lookup("OneHot").grad is not_differentiable
