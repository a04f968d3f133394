"""Plan.trace's live-bytes lower bound counts buffers, not tensors: views hold their input's, copies own theirs."""

from __future__ import annotations

import numpy as np

import cellgraph as cg


def test_a_view_holds_its_inputs_buffer_and_a_copying_transpose_owns_its_own() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((64, 4), "float32", name="x")
        y = x * 2.0  # 1024 bytes
        r = cg.reshape(y, (4, 64))  # a view of y: y's buffer lives as long as r does
        t = cg.transpose(r)  # Transpose may return a view; its CPU kernel copies: 1024 bytes of its own
        loss = cg.reduce_sum(t * cg.transpose(r))
    plan = cg.Session(g, fuse=False).make_callable([loss], [x])
    xv = np.ones((64, 4), np.float32)
    (value,), peak = plan.trace(xv)
    assert value == 4.0 * 64 * 4
    # At the second transpose: y's buffer (held by r, read for the last time) and both transposes, 1024
    # bytes each; counting tensors, not buffers, gave 1024 (y dies at the reshape, transposes were views).
    assert peak == 3 * 1024


def test_variables_feeds_and_constants_are_not_counted() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((64, 4), "float32", name="x")
        w = cg.variable(np.ones((4, 4), np.float32), name="w")
        c = cg.constant(np.ones((64, 4), np.float32))
        z = cg.identity(w) * 1.0  # the identity is a view of the variable: not counted; the product is
        loss = cg.reduce_sum(cg.matmul(x + c, z))
    plan = cg.Session(g, fuse=False).make_callable([loss], [x])
    (value,), peak = plan.trace(np.ones((64, 4), np.float32))
    assert value == 2.0 * 4 * 64 * 4
    # At the matmul: x + c (1024 bytes), z (64 bytes) and the product (1024 bytes).
    assert peak == 1024 + 64 + 1024
