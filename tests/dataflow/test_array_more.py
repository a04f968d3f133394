"""stack, unstack, split, tile, broadcast_to, reverse: TensorFlow's semantics, and
every error they raise with the words a user reads (values and gradients are
checked by the op table, tests/dataflow/op_cases/array_more.py)."""

from __future__ import annotations

import numpy as np
import pytest

import cellgraph as cg
from cellgraph.dataflow.ops.base import apply

from .errors_helpers import ph, raises

pytestmark = pytest.mark.usefixtures("fresh_graph")

X = np.arange(24, dtype=np.float32).reshape(2, 3, 4)


def _run(fetches: object, feeds: dict) -> object:
    return cg.Session(cg.get_default_graph()).run(fetches, feeds)


# ---------------------------------------------------------------- semantics
def test_split_by_count_and_sizes_matches_numpy() -> None:
    x = ph(None, 3, 4)
    by_count = cg.split(x, 2, axis=-1)
    by_sizes = cg.split(x, [1, -1], axis=1)
    assert [t.shape for t in by_count] == [(None, 3, 2)] * 2
    assert [t.shape for t in by_sizes] == [(None, 1, 4), (None, 2, 4)]
    got = _run(by_count + by_sizes, {x: X})
    want = np.split(X, 2, axis=2) + np.split(X, [1], axis=1)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def test_unstack_gives_the_slices_without_the_axis() -> None:
    x = ph(2, 3, 4)
    pieces = cg.unstack(x, axis=1)
    assert len(pieces) == 3 and all(p.shape == (2, 4) for p in pieces)
    for i, got in enumerate(_run(pieces, {x: X})):
        np.testing.assert_array_equal(got, X[:, i])


def test_unstack_of_an_empty_axis_is_no_tensors() -> None:
    assert cg.unstack(ph(0, 3)) == []


def test_stack_then_unstack_round_trips_and_the_gradient_reaches_each_input() -> None:
    a, b = ph(None, 4, name="a"), ph(None, 4, name="b")
    s = cg.stack([a, b], axis=0)
    assert s.shape == (2, None, 4)
    back = cg.unstack(s)
    ga, gb = cg.gradients(cg.reduce_sum(s * np.float32(3.0)), [a, b])
    got = _run([s, *back, ga, gb], {a: X[0], b: X[1]})
    np.testing.assert_array_equal(got[0], np.stack([X[0], X[1]]))
    np.testing.assert_array_equal(got[1], X[0])
    np.testing.assert_array_equal(got[2], X[1])
    np.testing.assert_array_equal(got[3], np.full((3, 4), 3.0))


def test_tile_and_broadcast_to_match_numpy() -> None:
    x = ph(None, 3, 4)
    t = cg.tile(x, (1, 2, 3))
    b = cg.broadcast_to(cg.reduce_sum(x, 0, keepdims=True), (5, 3, 4))
    assert t.shape == (None, 6, 12) and b.shape == (5, 3, 4)
    got_t, got_b = _run([t, b], {x: X})
    np.testing.assert_array_equal(got_t, np.tile(X, (1, 2, 3)))
    np.testing.assert_array_equal(got_b, np.broadcast_to(X.sum(0, keepdims=True), (5, 3, 4)))


def test_reverse_flips_each_named_axis() -> None:
    x = ph(2, 3, 4)
    np.testing.assert_array_equal(_run(cg.reverse(x, [-1, 0]), {x: X}), X[::-1, :, ::-1])


# ------------------------------------------------------------------ errors
def test_split_count_that_does_not_divide() -> None:
    with raises(cg.ShapeError, "Split 'split' (test_array_more.py"):
        cg.split(ph(2, 5), 2, axis=1)
    with raises(cg.ShapeError, "cannot split (2, 5) on axis 1: 5 does not split into 2 equal pieces"):
        cg.split(ph(2, 5), 2, axis=1)


def test_split_sizes_that_do_not_add_up() -> None:
    with raises(cg.ShapeError, "cannot split (2, 5) on axis 1: sizes (1, 2) add up to 3, not 5"):
        cg.split(ph(2, 5), [1, 2], axis=1)
    with raises(cg.ShapeError, "cannot split (2, 5) on axis 1: sizes (4, -1, 3) need more than the 5 there are"):
        cg.split(ph(2, 5), [4, -1, 3], axis=1)


def test_split_sizes_must_be_nonnegative_with_one_rest() -> None:
    with raises(cg.ShapeError, "sizes (-1, -1) must be >= 0, with at most one -1 for the rest of the axis"):
        cg.split(ph(2, 5), [-1, -1], axis=1)
    with raises(cg.ShapeError, "sizes (-2, 7) must be >= 0, with at most one -1"):
        cg.split(ph(2, 5), [-2, 7], axis=1)


def test_split_into_no_pieces_and_of_a_scalar_and_bad_axis() -> None:
    with raises(cg.ShapeError, "cannot split into 0 pieces: need at least one"):
        cg.split(ph(2, 5), 0)
    with raises(cg.ShapeError, "split: num_or_size_splits is empty: give a count or at least one size"):
        cg.split(ph(2, 5), [])
    with raises(cg.ShapeError, "split cannot cut a scalar: 's:0' has shape ()"):
        cg.split(ph(name="s"), 1)
    with raises(cg.ShapeError, "split: axis 2 is out of range for rank 2"):
        cg.split(ph(2, 5), 1, axis=2)
    with raises(cg.ShapeError, "split: num_or_size_splits must be an int or a sequence of ints, got [1.5, 2]"):
        cg.split(ph(2, 5), [1.5, 2])


def test_split_of_an_axis_known_only_at_run_time_fails_at_the_node() -> None:
    x = ph(None, 2)
    a, _ = cg.split(x, 2)
    with pytest.raises(
        cg.ExecutionError,
        match=r"^Split 'split' .* failed while running: .*"
        r"cannot split \(3, 2\) on axis 0: 3 does not split into 2 equal pieces",
    ):
        _run(a, {x: np.zeros((3, 2), np.float32)})


def test_unstack_errors() -> None:
    with raises(
        cg.ShapeError, "unstack of 'x:0' (None, 3): the size of axis 0 is not known until the graph runs; pass num="
    ):
        cg.unstack(ph(None, 3))
    with raises(cg.ShapeError, "unstack cannot unpack a scalar: 's:0' has shape ()"):
        cg.unstack(ph(name="s"))
    with raises(cg.ShapeError, "unstack: axis -3 is out of range for rank 2"):
        cg.unstack(ph(2, 3), axis=-3)


def test_stack_errors_leave_the_graph_unchanged() -> None:
    g = cg.get_default_graph()
    a = ph(2, 3, name="a")
    before = len(g.nodes)
    with raises(cg.ShapeError, "stack needs tensors of one shape: 'a:0' is (2, 3), 'const:0' is (3,)"):
        cg.stack([a, np.ones(3, np.float32)])
    assert len(g.nodes) == before  # the constant made for the list went again
    with raises(cg.ShapeError, "stack needs at least one tensor, got none"):
        cg.stack([])
    with raises(cg.ShapeError, "stack: axis 3 is out of range for rank 3"):
        cg.stack([a, a], axis=3)


def test_tile_errors() -> None:
    with raises(cg.ShapeError, "Tile 'tile' (test_array_more.py"):
        cg.tile(ph(2, 3), (2,))
    with raises(cg.ShapeError, "multiples (2,) need one entry per dim of (2, 3)"):
        cg.tile(ph(2, 3), (2,))
    with raises(cg.ShapeError, "multiples (1, -2) must be >= 0"):
        cg.tile(ph(2, 3), (1, -2))
    with raises(cg.ShapeError, "tile: multiples must be an int or a sequence of ints, got 'ab'"):
        cg.tile(ph(2, 3), "ab")  # type: ignore[arg-type]


def test_tile_grad_shape_mismatch() -> None:
    with raises(cg.ShapeError, "gradient (5, 3) is not (2, 3) tiled (2, 1)"):
        apply("TileGrad", [ph(5, 3, name="g"), ph(2, 3)], {"multiples": (2, 1)})


def test_broadcast_to_errors() -> None:
    with raises(cg.ShapeError, "BroadcastTo 'broadcast_to' (test_array_more.py"):
        cg.broadcast_to(ph(2, 3), (3,))
    with raises(cg.ShapeError, "cannot broadcast (2, 3) to (3,): it has more dims"):
        cg.broadcast_to(ph(2, 3), (3,))
    with raises(cg.ShapeError, "cannot broadcast (2, 3) to (4, 3): dim 0 is 2, neither 1 nor 4"):
        cg.broadcast_to(ph(2, 3), (4, 3))
    with raises(cg.ShapeError, "shape (2, -1) must be >= 0"):
        cg.broadcast_to(ph(2, 1), (2, -1))


def test_broadcast_to_a_dim_known_only_at_run_time_fails_at_the_node() -> None:
    x = ph(None, 3)
    y = cg.broadcast_to(x, (4, 3))
    with pytest.raises(cg.ExecutionError, match=r"^BroadcastTo 'broadcast_to' .* failed while running: .*broadcast"):
        _run(y, {x: np.zeros((2, 3), np.float32)})


def test_reverse_errors() -> None:
    with raises(cg.ShapeError, "reverse: axis (0, 0) names an axis twice (as non-negative axes)"):
        cg.reverse(ph(2, 3), [0, -2])
    with raises(cg.ShapeError, "reverse: axis 2 is out of range for rank 2"):
        cg.reverse(ph(2, 3), 2)


# --------------------------------------------------- pad REFLECT, SYMMETRIC
def test_pad_reflect_and_symmetric_match_numpy_and_fold_the_gradient_back() -> None:
    x = ph(None, 4)
    r = cg.pad(x, ((1, 1), (3, 2)), mode="REFLECT")
    s = cg.pad(x, ((0, 0), (4, 1)), mode="symmetric")
    assert r.shape == (None, 9) and s.shape == (None, 9)
    (dx,) = cg.gradients(cg.reduce_sum(r), [x])
    data = X[:, 0]
    got_r, got_s, got_dx = _run([r, s, dx], {x: data})
    np.testing.assert_array_equal(got_r, np.pad(data, ((1, 1), (3, 2)), mode="reflect"))
    np.testing.assert_array_equal(got_s, np.pad(data, ((0, 0), (4, 1)), mode="symmetric"))
    # Each element's gradient counts its copies: [a b c d] on axis 1 pads to d c b [a b c d] c b.
    np.testing.assert_array_equal(got_dx, np.array([[1, 3, 3, 2], [1, 3, 3, 2]]) * 2)


def test_pad_mirror_errors() -> None:
    with raises(cg.ShapeError, "MirrorPad 'pad' (test_array_more.py"):
        cg.pad(ph(2, 3), ((0, 0), (3, 0)), mode="REFLECT")
    with raises(cg.ShapeError, "REFLECT padding (3, 0) of axis 1 of (2, 3) must be less than its size 3"):
        cg.pad(ph(2, 3), ((0, 0), (3, 0)), mode="REFLECT")
    with raises(cg.ShapeError, "SYMMETRIC padding (0, 4) of axis 1 of (2, 3) must be at most its size 3"):
        cg.pad(ph(2, 3), ((0, 0), (0, 4)), mode="SYMMETRIC")
    with raises(cg.ShapeError, "paddings ((0, 0),) need one (before, after) pair per dim of (2, 3)"):
        cg.pad(ph(2, 3), ((0, 0),), mode="REFLECT")
    with raises(cg.ShapeError, "paddings ((0, 0), (-1, 0)) must be >= 0"):
        cg.pad(ph(2, 3), ((0, 0), (-1, 0)), mode="SYMMETRIC")
    with raises(cg.GraphError, "pad: mode must be 'CONSTANT', 'REFLECT' or 'SYMMETRIC', got 'edge'"):
        cg.pad(ph(2, 3), ((0, 0), (1, 0)), mode="edge")


def test_pad_mirror_of_a_dim_known_only_at_run_time_fails_at_the_node() -> None:
    x = ph(None, 3)
    y = cg.pad(x, ((2, 0), (0, 0)), mode="REFLECT", name="mirror")
    with pytest.raises(cg.ExecutionError, match=r"^MirrorPad 'mirror' .* failed while running: .*"
                       r"REFLECT padding \(2, 0\) of axis 0 of \(2, 3\) does not fit its size 2"):  # fmt: skip
        _run(y, {x: np.zeros((2, 3), np.float32)})


def test_mirror_pad_grad_smaller_than_its_paddings() -> None:
    with raises(cg.ShapeError, "gradient (2, 3) is smaller than its paddings ((2, 1), (0, 0))"):
        apply("MirrorPadGrad", [ph(2, 3, name="g")], {"paddings": ((2, 1), (0, 0)), "mode": "SYMMETRIC"})


# ------------------------------------------------ space_to_depth, depth_to_space
def test_space_to_depth_follows_tensorflow_and_depth_to_space_inverts_it() -> None:
    x = ph(None, 4, 6, 3)
    y = cg.space_to_depth(x, 2)
    z = cg.depth_to_space(y, 2)
    assert y.shape == (None, 2, 3, 12) and z.shape == (None, 4, 6, 3)
    data = np.random.default_rng(0).normal(size=(2, 4, 6, 3)).astype(np.float32)
    got_y, got_z = _run([y, z], {x: data})
    # TensorFlow: y[n, i, j, (di * b + dj) * C + c] = x[n, i * b + di, j * b + dj, c]
    for di in range(2):
        for dj in range(2):
            np.testing.assert_array_equal(got_y[..., (di * 2 + dj) * 3 : (di * 2 + dj + 1) * 3], data[:, di::2, dj::2])
    np.testing.assert_array_equal(got_z, data)
    (dx,) = cg.gradients(cg.reduce_sum(y * np.arange(12, dtype=np.float32)), [x])
    # Each input element's gradient is the weight of the output channel it went to: depth_to_space of the weights.
    weights = np.broadcast_to(np.arange(12, dtype=np.float32), (2, 2, 3, 12))
    want = weights.reshape(2, 2, 3, 2, 2, 3).transpose(0, 1, 3, 2, 4, 5).reshape(2, 4, 6, 3)
    np.testing.assert_array_equal(_run(dx, {x: data}), want)


def test_space_to_depth_of_an_empty_batch() -> None:
    x = ph(0, 4, 4, 1)
    assert _run(cg.space_to_depth(x, 2), {x: np.zeros((0, 4, 4, 1), np.float32)}).shape == (0, 2, 2, 4)


def test_space_to_depth_and_depth_to_space_errors() -> None:
    with raises(cg.ShapeError, "space_to_depth needs an NHWC tensor of rank 4: 'x:0' has shape (4, 4, 3)"):
        cg.space_to_depth(ph(4, 4, 3), 2)
    with raises(cg.ShapeError, "space_to_depth: block_size must be at least 2, got 1"):
        cg.space_to_depth(ph(1, 4, 4, 3), 1)
    with raises(cg.ShapeError, "space_to_depth of 'a:0' (1, 4, 6, 3): height and width must divide by block_size 4"):
        cg.space_to_depth(ph(1, 4, 6, 3, name="a"), 4)
    with raises(cg.ShapeError, "space_to_depth of 'b:0' (1, None, 6, 3): height, width and channels must be known"):
        cg.space_to_depth(ph(1, None, 6, 3, name="b"), 2)
    with raises(cg.ShapeError, "depth_to_space of 'c:0' (1, 2, 2, 6): channels must divide by block_size^2 = 4"):
        cg.depth_to_space(ph(1, 2, 2, 6, name="c"), 2)
