"""cg.save_model and cg.onnx.export from a real Job on a LocalCluster, and from its checkpoint folder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import cellgraph as cg
from cellgraph.cluster.cluster import Cluster
from cellgraph.examples import digits, models

TIMEOUT = 120.0


@pytest.mark.slow
def test_a_job_and_its_checkpoint_folder_export_the_parameter_servers_values(
    data: digits.Split, tmp_path: Path
) -> None:
    model = models.mlp()
    with Cluster.local(workers=1, ps=1) as cluster:
        job = cg.train(
            model.loss, (data.x_train, data.y_train), cluster=cluster, optimizer=cg.optim.Adam(1e-2),
            replicas=1, batch_size=64, steps=30, checkpoint_every=10, checkpoint_dir=tmp_path / "ckpt",
        )  # fmt: skip
        try:
            job.wait(TIMEOUT)
            assert job.status == "finished"
            values = job.variables()
            # What the job says for these inputs is what every export must say.
            want = job.evaluate(model.logits, {model.x: data.x_test})
            cg.save_model(tmp_path / "from-job", model.x, model.logits, job)
            cg.onnx.export(tmp_path / "from-job.onnx", model.x, model.logits, job)
        finally:
            job.close()
    for name, value in values.items():
        assert not np.array_equal(value, model.graph.node(name).attrs["initial_value"]), f"{name} did not train"
    loaded = cg.load_model(tmp_path / "from-job")
    assert np.abs(loaded(data.x_test) - want).max() <= 1e-4
    runtime = ort.InferenceSession(str(tmp_path / "from-job.onnx"), providers=["CPUExecutionProvider"])
    assert np.abs(runtime.run(None, {"x": data.x_test})[0] - want).max() <= 1e-4
    # The job's last checkpoint (written as it finished) holds the same values.
    from_folder = cg.load_model(cg.save_model(tmp_path / "from-ckpt", model.x, model.logits, tmp_path / "ckpt"))
    assert np.abs(from_folder(data.x_test) - want).max() <= 1e-4


@pytest.mark.slow
def test_an_imported_onnx_model_fine_tunes_on_a_cluster(data: digits.Split, tmp_path: Path) -> None:
    # The mlp, trained 3 steps here, leaves as ONNX and comes back in as a new graph of variables.
    model = models.mlp()
    session = cg.Session(model.graph)
    for i in range(3):
        rows = slice(i * 64, (i + 1) * 64)
        session.run(model.train_op, {model.x: data.x_train[rows], model.y: data.y_train[rows]})
    cg.onnx.export(tmp_path / "mlp.onnx", model.x, model.logits, session)
    imported = cg.onnx.import_model(tmp_path / "mlp.onnx")
    with imported.graph.as_default():
        labels = cg.placeholder((None,), "int32", name="labels")
        loss = cg.losses.sparse_softmax_cross_entropy(imported.outputs[0], labels)
    before = imported.session.variable_values()
    with Cluster.local(workers=1, ps=1) as cluster:
        job = cg.train(
            loss, (data.x_train, data.y_train), cluster=cluster, optimizer=cg.optim.Adam(1e-2),
            replicas=1, batch_size=64, steps=60, checkpoint_every=None,
        )  # fmt: skip
        try:
            job.wait(TIMEOUT)
            assert job.status == "finished"
            logits = job.evaluate(imported.outputs[0], {imported.inputs[0]: data.x_test})
            trained = job.variables()
        finally:
            job.close()
    assert sorted(trained) == sorted(before)
    assert all(not np.array_equal(trained[k], before[k]) for k in before)
    start = imported(data.x_test)
    accuracy, first = float((logits.argmax(1) == data.y_test).mean()), float((start.argmax(1) == data.y_test).mean())
    assert accuracy > first and accuracy >= 0.85, (first, accuracy)
