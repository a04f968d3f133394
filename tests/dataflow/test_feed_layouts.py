"""Feeds in every memory layout NumPy makes give the contiguous feed's numbers, and fetched values never alias state.

A kernel that reads ``x.ravel()`` or flat indices of a non-contiguous view, or keeps a view of a feed or a variable
that a later in-place update rewrites, gives wrong numbers without an error. Each op family runs here on
Fortran-order, reversed (negative stride), strided-slice, zero-stride (``np.broadcast_to``) and read-only feeds,
and must equal its run on the C-contiguous copy bit for bit (fused and unfused).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import cellgraph as cg


def _layouts(a: np.ndarray) -> dict[str, np.ndarray]:
    """``a``'s values in other layouts (each a view that is not C-contiguous, or not writeable)."""
    read_only = a.copy()
    read_only.flags.writeable = False
    return {
        "fortran": np.asfortranarray(a),
        "reversed": np.ascontiguousarray(a[::-1])[::-1],
        "strided": np.repeat(a, 2, axis=-1)[..., ::2],
        "read-only": read_only,
    }


F32 = "float32"
CASES: list[tuple[str, list[tuple[int, ...]], Callable[..., Any], str]] = [
    ("fused chain", [(4, 6), (4, 6)], lambda a, b: cg.exp(a * b + 1.0) - cg.tanh(a), F32),
    ("matmul", [(4, 6), (6, 5)], lambda a, b: cg.matmul(a, b), F32),
    ("matmul transposed", [(6, 4), (5, 6)], lambda a, b: cg.matmul(a, b, transpose_a=True, transpose_b=True), F32),
    ("batch matmul", [(3, 4, 6), (3, 6, 5)], lambda a, b: cg.matmul(a, b), F32),
    ("conv2d", [(2, 6, 6, 3), (3, 3, 3, 4)], lambda a, b: cg.conv2d(a, b, 1, "SAME"), F32),
    ("reductions", [(4, 6)], lambda a: [cg.reduce_sum(a, 0), cg.reduce_max(a, 1), cg.argmax(a, 1)], F32),
    ("gather", [(6, 4)], lambda a: cg.gather(a, cg.constant(np.array([5, 0, 3, 3], np.int32))), F32),
    ("softmax", [(4, 6)], lambda a: [cg.softmax(a), cg.log_softmax(a, 0)], F32),
    ("layer_norm", [(4, 6), (6,), (6,)], lambda a, g, b: cg.layer_norm(a, g, b), F32),
    ("cumsum", [(4, 6)], lambda a: [cg.cumsum(a, 0), cg.cumsum(a, 1)], F32),
    ("top_k", [(4, 6)], lambda a: list(cg.top_k(a, 3)), F32),
    ("transpose", [(2, 4, 6)], lambda a: cg.transpose(a, (2, 0, 1)) + 1.0, F32),
    ("max_pool", [(2, 6, 6, 3)], lambda a: cg.max_pool(a, 2, 2, "VALID"), F32),
    ("int arithmetic", [(4, 6), (4, 6)], lambda a, b: [a * b + a, cg.reduce_sum(a, 0)], "int32"),
    ("gradients", [(4, 6), (6, 5)], lambda a, b: cg.gradients(cg.reduce_sum(cg.matmul(a, b) ** 2), [a, b]), F32),
]


def _arrays(shapes: list[tuple[int, ...]], dtype: str) -> list[np.ndarray]:
    rng = np.random.default_rng(len(shapes))
    if dtype == "int32":
        return [rng.integers(-5, 5, s).astype(np.int32) for s in shapes]
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


@pytest.mark.parametrize("fuse", [True, False])
@pytest.mark.parametrize(("shapes", "build", "dtype"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_every_layout_of_a_feed_gives_the_contiguous_feeds_numbers(
    shapes: list[tuple[int, ...]], build: Callable[..., Any], dtype: str, fuse: bool
) -> None:
    g = cg.Graph()
    with g.as_default():
        phs = [cg.placeholder(s, dtype, name=f"x{i}") for i, s in enumerate(shapes)]
        out = build(*phs)
    sess = cg.Session(g, fuse=fuse)
    arrays = _arrays(shapes, dtype)
    fetch = out if isinstance(out, list) else [out]
    want = sess.run(fetch, dict(zip(phs, arrays)))
    for i, a in enumerate(arrays):
        variants = _layouts(a)
        # A zero-stride view: every row the same. Its contiguous copy gives the numbers to match.
        row = np.broadcast_to(a[(0,) * (a.ndim - 1)], a.shape)
        for name, (fed, same) in {**{k: (v, want) for k, v in variants.items()}, "broadcast": (row, None)}.items():
            base = list(arrays)
            if same is None:
                base[i] = np.ascontiguousarray(row)
                same = sess.run(fetch, dict(zip(phs, base)))
            base[i] = fed
            got = sess.run(fetch, dict(zip(phs, base)))
            for k, (x, y) in enumerate(zip(got, same)):
                np.testing.assert_array_equal(x, y, err_msg=f"input {i} fed {name}, output {k}")


def test_a_zero_d_feed_and_a_zero_d_broadcast_view() -> None:
    g = cg.Graph()
    with g.as_default():
        s = cg.placeholder((), name="s")
        x = cg.placeholder((3,), name="x")
        out = [cg.exp(s * 2.0) + 1.0, x * s, cg.reduce_sum(x * s)]
    sess = cg.Session(g)
    xv = np.arange(3, dtype=np.float32)
    want = sess.run(out, {s: np.float32(1.5), x: xv})
    scalar = np.array(1.5, np.float32)
    scalar.flags.writeable = False
    for fed in (scalar, np.broadcast_to(np.float32(1.5), ()), 1.5):
        for x_fed in (xv, np.broadcast_to(np.float32(2.0), (3,))):
            got = sess.run(out, {s: fed, x: x_fed})
            expected = want if x_fed is xv else sess.run(out, {s: np.float32(1.5), x: np.full(3, 2.0, np.float32)})
            for a, b in zip(got, expected):
                np.testing.assert_array_equal(a, b)


def test_fetched_values_do_not_change_when_a_later_step_updates_state() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 3), name="x")
        w = cg.variable(np.asfortranarray(np.arange(6, dtype=np.float32).reshape(3, 2)), name="w")
        v = cg.variable(np.arange(6, dtype=np.float32)[::-1], name="v")
        train = cg.optim.Adam(0.1).minimize(cg.reduce_sum(cg.matmul(x, w) ** 2) + cg.reduce_sum(v * v))
        views = [w, cg.identity(w), cg.reshape(w, (6,)), w[1:], w[:, 0], cg.transpose(w), cg.expand_dims(w, 0),
                 cg.stop_gradient(w), v, v[::2], cg.reshape(v, (2, 3)), cg.identity(x), cg.reshape(x, (-1,))]  # fmt: skip
        bump = cg.assign_add(v, cg.ones_like(v))
        double = cg.assign(w, w * 2.0)
        p = cg.placeholder((3, 2), name="p")
        load = cg.assign(w, p)
    sess = cg.Session(g)
    feed = np.arange(6, dtype=np.float32).reshape(2, 3)
    fetched = sess.run(views, {x: feed})
    kept = [a.copy() for a in fetched]
    same_run = sess.run([w, v, train, bump], {x: feed})[:2]  # fetched in the step that updates them
    kept_same_run = [a.copy() for a in same_run]
    for _ in range(2):
        sess.run([train, bump, double], {x: feed})
    for i, (a, b) in enumerate(zip(fetched + same_run, kept + kept_same_run)):
        np.testing.assert_array_equal(a, b, err_msg=f"fetch {i} changed after later steps")
    np.testing.assert_array_equal(feed, np.arange(6, dtype=np.float32).reshape(2, 3))
    # A fed value assigned to a variable is the variable's own copy: updates do not write into the caller's array.
    loaded = np.ones((3, 2), np.float32)
    sess.run(load, {p: loaded})
    sess.run([train, double], {x: feed})
    np.testing.assert_array_equal(loaded, np.ones((3, 2), np.float32))
    assert not np.array_equal(sess.run(w), loaded)


def test_a_fetched_feed_is_a_copy_the_callers_buffer_refill_does_not_change() -> None:
    # Before: fetching a fed tensor handed back the caller's own array; a data loader that refills its batch
    # buffer in place changed every batch already fetched (Identity of a feed was copied, the feed itself not).
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 3), name="x")
        y = x * 2.0
    sess = cg.Session(g)
    buffer = np.ones((2, 3), np.float32)
    fetched = sess.run([x, y], {x: buffer})
    overridden = sess.run(y, {y: buffer})  # a fed intermediate, too
    plan = sess.make_callable([x], [x])
    (through_plan,) = plan(buffer)
    buffer[:] = 7.0  # the loader's next batch
    for value in (*fetched[:1], overridden, through_plan):
        assert not np.shares_memory(value, buffer)
        np.testing.assert_array_equal(value, np.ones((2, 3), np.float32))
    np.testing.assert_array_equal(fetched[1], np.full((2, 3), 2.0, np.float32))
