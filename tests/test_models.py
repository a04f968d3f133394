"""The example models (cellgraph/examples/models.py, deep_models.py): short runs reach a lower accuracy bar than
the demo's full ones (which print their figure); the training switch; the demo's model choices."""

from __future__ import annotations

import numpy as np
import pytest

import cellgraph as cg
from cellgraph import cli
from cellgraph.examples import digits, models
from cellgraph.examples.train import fit
from tests.cluster.test_cli_train import run_cli

# Epochs of a short run and the accuracy it must reach (the demo's full runs reach >= 97%).
SHORT = {"resnet": 3, "inception_v3": 3, "transformer": 4, "lstm": 8}
BAR = 0.85


@pytest.fixture(scope="module")
def data() -> digits.Split:
    return digits.load()


@pytest.mark.parametrize(
    "name",
    [
        "transformer",
        "lstm",
        pytest.param("resnet", marks=pytest.mark.slow),
        pytest.param("inception_v3", marks=pytest.mark.slow),
    ],
)
def test_a_short_run_of_each_new_model_learns_the_digits(name: str, data: digits.Split) -> None:
    result = fit(models.MODELS[name](), data, epochs=SHORT[name], progress=False)
    assert result.test_accuracy >= BAR, f"{name}: {result.test_accuracy:.2%} after {SHORT[name]} epochs"


@pytest.mark.parametrize("name", ["resnet", "inception_v3"])
def test_batch_normalized_models_evaluate_with_the_switch_off_and_change_nothing(name: str) -> None:
    model = models.MODELS[name]()
    assert model.training is not None and model.training.dtype == "bool" and model.training.shape == ()
    moving = [n.output(0) for n in model.graph.nodes if n.op == "Variable" and n.name.endswith("/moving_mean")]
    assert moving, "a batch-normalized model has moving statistics"
    sess = cg.Session(model.graph)
    x = np.random.default_rng(0).uniform(0, 1, (16, 8, 8, 1)).astype(np.float32)
    y = np.zeros(16, np.int32)
    before = sess.run(moving)
    sess.run(model.accuracy, model.eval_feeds(x, y))
    for a, b in zip(before, sess.run(moving)):
        np.testing.assert_array_equal(a, b)
    sess.run(model.train_op, {model.x: x, model.y: y})  # the switch's default: training
    assert any(not np.array_equal(a, b) for a, b in zip(before, sess.run(moving)))


def test_models_without_batch_norm_have_no_switch_and_feed_only_the_data() -> None:
    model = models.MODELS["lstm"]()
    assert model.training is None
    assert list(model.eval_feeds("x", "y")) == [model.x, model.y]


def test_the_models_are_built_of_the_layers_they_name() -> None:
    ops = {name: {n.op for n in models.MODELS[name]().graph.nodes} for name in SHORT}
    assert {"FusedBatchNorm", "Conv2D"} <= ops["resnet"] and {"AvgPool", "MaxPool"} <= ops["inception_v3"]
    assert {"BatchMatMul", "Softmax", "LayerNorm", "Gelu", "Gather"} <= ops["transformer"]
    inception = models.MODELS["inception_v3"]().graph
    # The factorised convolutions: a 1x3 and a 3x1 kernel side by side.
    assert inception.node("mixed_c/b3_1x3/conv/kernel").output(0).shape[:2] == (1, 3)
    assert inception.node("mixed_c/b3_3x1/conv/kernel").output(0).shape[:2] == (3, 1)
    lstm = models.MODELS["lstm"]().graph
    variables = [n.name for n in lstm.nodes if n.op == "Variable" and n.name.startswith("lstm/")]
    assert sorted(variables) == ["lstm/bias", "lstm/kernel", "lstm/recurrent_kernel"]  # shared by the 8 steps


def test_demo_local_model_trains_the_one_named(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["demo", "--local", "--model", "transformer", "--epochs", "1", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "transformer: test accuracy" in out and "(target 97%" in out and "mlp:" not in out


def test_demo_model_and_models_together_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["demo", "--local", "--model", "lstm", "--models", "mlp"])
    assert exit_.value.code == 2
    assert "cellgraph demo: error: --model and --models both choose what to train: give one" in capsys.readouterr().err


def test_demo_model_choices_name_the_new_models(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["demo", "--model", "vgg16"])
    err = capsys.readouterr().err
    assert "invalid choice: 'vgg16'" in err
    assert all(name in err for name in ("resnet", "inception_v3", "transformer", "lstm"))


@pytest.mark.slow
@pytest.mark.parametrize("model", ["transformer", "resnet"])  # resnet: batch norm's moving statistics on the PS
def test_demo_trains_a_model_on_the_embedded_cluster(model: str) -> None:
    ran = run_cli("demo", "--model", model, "--check", "--no-progress")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert f"{model}, 400 steps in sync mode, 2 replica(s) of batch 64" in ran.stdout
    assert f"{model}: test accuracy" in ran.stdout and "(target 97%, met)" in ran.stdout
    assert ran.leftover == []
