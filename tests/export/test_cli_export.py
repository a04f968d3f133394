"""``cellgraph export``: a checkpoint folder of an example model out as ONNX or a saved model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import cellgraph as cg
from cellgraph.cli import main
from cellgraph.cluster.ps.checkpoint import write_shard_checkpoint
from cellgraph.cluster.ps.config import OptimizerConfig, TrainingConfig, VariableSpec
from cellgraph.examples import digits

from .conftest import train


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory, data: digits.Split) -> tuple[Path, np.ndarray, np.ndarray]:
    """An mlp's checkpoint folder as one PS shard writes it, the test images, and the session's logits."""
    trained = train("mlp", data, steps=3)
    values = trained.session.variable_values()
    folder = tmp_path_factory.mktemp("ckpt")
    write_shard_checkpoint(
        folder, job_id="cli", shard=0, num_shards=1, global_step=3, tensors=values,
        versions=dict.fromkeys(values, 3), specs=[VariableSpec(k, v.dtype, v.shape) for k, v in values.items()],
        optimizer=OptimizerConfig(), training=TrainingConfig(),
    )  # fmt: skip
    return folder, trained.x_test, trained.logits(trained.x_test)


def test_export_writes_an_onnx_model_of_the_checkpoint(
    checkpoint: tuple[Path, np.ndarray, np.ndarray], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder, x, want = checkpoint
    out = tmp_path / "mlp.onnx"
    argv = ["export", "--checkpoint", str(folder), "--model", "mlp", "--format", "onnx", "-o", str(out)]
    assert main(argv) == 0
    assert f"wrote the ONNX model of mlp (x:0 -> logits/bias_add:0) to {out}" in capsys.readouterr().out
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    for rows in (1, 37):
        assert np.abs(session.run(None, {"x": x[:rows]})[0] - want[:rows]).max() <= 1e-4


def test_export_writes_a_saved_model_of_the_checkpoint(
    checkpoint: tuple[Path, np.ndarray, np.ndarray], tmp_path: Path
) -> None:
    folder, x, want = checkpoint
    out = tmp_path / "saved"
    assert main(["export", "--checkpoint", str(folder), "--model", "mlp", "--format", "saved", "-o", str(out)]) == 0
    assert np.abs(cg.load_model(out)(x) - want).max() <= 1e-4


def test_export_of_a_checkpoint_of_another_model_says_what_is_missing(
    checkpoint: tuple[Path, np.ndarray, np.ndarray], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder, _, _ = checkpoint
    argv = [
        "export",
        "--checkpoint",
        str(folder),
        "--model",
        "inception",
        "--format",
        "onnx",
        "-o",
        str(tmp_path / "m"),
    ]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "cellgraph export: error: variable 'stem/kernel' has no value in the checkpoint folder" in err
    assert not (tmp_path / "m").exists()


def test_export_refuses_an_unknown_format(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["export", "--checkpoint", str(tmp_path), "--model", "mlp", "--format", "tflite", "-o", "x"])
    assert exit_info.value.code == 2
    assert "cellgraph export: error: argument --format: invalid choice: 'tflite'" in capsys.readouterr().err


def test_export_of_a_batch_normalized_model_fixes_its_training_switch_off(
    data: digits.Split, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The ResNet's checkpoint (moving statistics included) exports as it evaluates: the switch off.
    trained = train("resnet", data, steps=3)
    values = trained.session.variable_values()
    folder = tmp_path / "ckpt"
    write_shard_checkpoint(
        folder, job_id="cli", shard=0, num_shards=1, global_step=3, tensors=values,
        versions=dict.fromkeys(values, 3), specs=[VariableSpec(k, v.dtype, v.shape) for k, v in values.items()],
        optimizer=OptimizerConfig(), training=TrainingConfig(),
    )  # fmt: skip
    out = tmp_path / "resnet.onnx"
    assert main(["export", "--checkpoint", str(folder), "--model", "resnet", "--format", "onnx", "-o", str(out)]) == 0
    assert "wrote the ONNX model of resnet (x:0 -> " in capsys.readouterr().out
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["x"]
    for rows in (1, 37):
        x = trained.x_test[:rows]
        assert np.abs(session.run(None, {"x": x})[0] - trained.logits(x)).max() <= 1e-4
