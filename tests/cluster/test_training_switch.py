"""A replica's step leaves out the branch a training switch does not take (cluster/training_switch.py)."""

from __future__ import annotations

import numpy as np

import cellgraph as cg
from cellgraph.cluster.training_graph import load, prepare
from cellgraph.dataflow.graphdef import from_graphdef
from cellgraph.protos import graph_pb2


def bn_dropout_model(training: bool | None) -> cg.Tensor:
    """Dense, batch norm and dropout with a switch (``None``) or a fixed mode; the same weights every time."""
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 6), "float32", name="x")
        switch = cg.layers.training_switch() if training is None else training
        w = cg.variable(np.linspace(-1.0, 1.0, 24, dtype=np.float32).reshape(6, 4), name="w")
        h = cg.layers.batch_norm(cg.matmul(x, w), training=switch, momentum=0.9, name="bn")
        h = cg.layers.dropout(h, 0.5, seed=3, training=switch)
        loss = cg.reduce_mean(h * h, name="loss")
    return loss


def ops_of(graphdef: bytes) -> list[str]:
    return [node.op for node in from_graphdef(graph_pb2.GraphDef.FromString(graphdef)).nodes]


def test_the_switch_is_folded_to_training_and_the_step_matches_a_training_graph() -> None:
    switched, fixed = prepare(bn_dropout_model(None)), prepare(bn_dropout_model(True))
    assert "Where" not in ops_of(switched.graphdef) and "PlaceholderWithDefault" not in ops_of(switched.graphdef)
    assert len(ops_of(switched.graphdef)) <= len(ops_of(fixed.graphdef))
    assert switched.variables == fixed.variables and switched.states == fixed.states
    batch = [np.random.default_rng(0).normal(size=(8, 6)).astype(np.float32)]
    loss_a, pushed_a = load(switched).compute(switched.initial, batch)
    loss_b, pushed_b = load(fixed).compute(fixed.initial, batch)
    assert loss_a == loss_b
    for name in pushed_b:  # the gradients, and the moving statistics' changes
        np.testing.assert_array_equal(pushed_a[name], pushed_b[name], err_msg=name)


def test_the_users_graph_keeps_its_switch() -> None:
    loss = bn_dropout_model(None)
    before = [node.op for node in loss.graph.nodes]
    prepare(loss)
    assert [node.op for node in loss.graph.nodes] == before and "Where" in before
