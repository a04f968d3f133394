"""Issue 16's new ops in a training step placed on the GPU (Numba's simulator in the plain
run): batch_norm with its moving statistics, layer_norm, batched matmul and the new reductions
give the same losses, gradients' effects and moving statistics as the CPU session; and the
model's graph survives a GraphDef round trip."""

from __future__ import annotations

import numpy as np
import pytest

import cellgraph as cg

WORKER_CPU, GPU = "/job:worker/task:0/device:cpu:0", "/job:worker/task:0/device:gpu:0"


def _model() -> tuple[cg.Graph, dict[str, cg.Tensor]]:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 4, 3), "float32", name="x")
        training = cg.placeholder((), "bool", name="training")
        h = cg.layers.batch_norm(x, training=training, momentum=0.5)
        h = cg.layers.layer_norm(h)
        w = cg.variable(cg.init.glorot_uniform, shape=(3, 3), name="w")
        scores = cg.matmul(h @ w, h, transpose_b=True)  # (batch, 4, 4): a batched product
        loss = cg.reduce_mean(cg.reduce_logsumexp(scores, axis=-1) - cg.reduce_min(scores, axis=-1))
        step = cg.optim.SGD(0.1).minimize(loss)
        picks = cg.argmax(scores, axis=-1, output_type="int64")
    return g, {"x": x, "training": training, "loss": loss, "step": step, "picks": picks}


@pytest.mark.cuda
def test_a_training_step_on_the_gpu_matches_the_cpu() -> None:
    data = np.random.default_rng(8).normal(1.0, 2.0, (3, 4, 3)).astype(np.float32)
    results = []
    for on_gpu in (False, True):
        g, t = _model()
        if on_gpu:
            placement = cg.placement.place(g, [WORKER_CPU, GPU])
            assert placement.device_of["batch_norm/output_fused"] == GPU
            assert placement.device_of["layer_norm/output"] == GPU
            sess = cg.PartitionedSession(g, placement, timeout=600)
        else:
            sess = cg.Session(g)
        feeds = {t["x"]: data, t["training"]: True}
        losses = [float(sess.run([t["step"], t["loss"]], feeds)[1]) for _ in range(2)]
        evaluated = float(sess.run(t["loss"], {t["x"]: data, t["training"]: False}))
        moving = sess.run(g.node("batch_norm/moving_variance").output(0))
        picks = sess.run(t["picks"], feeds)
        results.append((losses, evaluated, moving, picks))
    (cpu_losses, cpu_eval, cpu_moving, cpu_picks), (gpu_losses, gpu_eval, gpu_moving, gpu_picks) = results
    np.testing.assert_allclose(gpu_losses, cpu_losses, rtol=1e-4)
    np.testing.assert_allclose(gpu_eval, cpu_eval, rtol=1e-4)
    np.testing.assert_allclose(gpu_moving, cpu_moving, rtol=1e-5)
    assert not np.allclose(cpu_moving, 1.0)  # the steps moved the statistics
    np.testing.assert_array_equal(gpu_picks, cpu_picks)


@pytest.mark.parametrize("training", [True, False])
def test_the_model_survives_a_graphdef_round_trip(training: bool) -> None:
    from cellgraph.dataflow.graphdef import from_graphdef, to_graphdef

    g, t = _model()
    copy = from_graphdef(to_graphdef(g))
    assert sorted(n.name for n in copy.nodes) == sorted(n.name for n in g.nodes)
    data = np.random.default_rng(9).normal(size=(2, 4, 3)).astype(np.float32)
    got = [
        cg.Session(graph).run(graph.node("reduce_mean").output(0), {"x:0": data, "training:0": training})
        for graph in (g, copy)
    ]
    np.testing.assert_allclose(got[0], got[1], rtol=1e-6)
