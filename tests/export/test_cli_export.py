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


@pytest.mark.parametrize(
    ("fmt", "output", "words"),
    [
        ("onnx", "out", "cannot write the ONNX model to '{out}': it is a folder; give a file name"),
        ("onnx", "a_file/m.onnx", "cannot write the ONNX model to '{out}': '{dir}/a_file' is a file, not a folder"),
        ("saved", "a_file", "cannot save a model to '{out}': it is a file; a saved model is a folder"),
        ("saved", "ckpt", "cannot save a model to folder '{out}': it already holds ckpt-0000000003, which are not a"),
    ],
)
def test_export_to_an_output_it_cannot_write_says_so_in_one_line_and_writes_nothing(
    checkpoint: tuple[Path, np.ndarray, np.ndarray],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    fmt: str,
    output: str,
    words: str,
) -> None:
    """Before: IsADirectoryError, NotADirectoryError and FileExistsError tracebacks, and a saved model written
    into the checkpoint folder among its checkpoints."""
    folder = checkpoint[0]
    (tmp_path / "out").mkdir()
    (tmp_path / "a_file").write_text("x")
    out = folder if output == "ckpt" else tmp_path / output
    before = sorted(p.name for p in folder.iterdir())
    argv = ["export", "--checkpoint", str(folder), "--model", "mlp", "--format", fmt, "-o", str(out)]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"cellgraph export: error: {words.format(out=out, dir=tmp_path)}")
    assert err.count("\n") == 1 and "Traceback" not in err
    assert sorted(p.name for p in folder.iterdir()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "out"] and not any((tmp_path / "out").iterdir())


def test_export_replaces_an_earlier_export_whole_and_leaves_no_temporary_file(
    checkpoint: tuple[Path, np.ndarray, np.ndarray], tmp_path: Path
) -> None:
    folder, images, logits = checkpoint
    for fmt, out in (("onnx", tmp_path / "m.onnx"), ("saved", tmp_path / "saved")):
        for _ in range(2):  # the second writes over the first
            argv = ["export", "--checkpoint", str(folder), "--model", "mlp", "--format", fmt, "-o", str(out)]
            assert main(argv) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "saved"]
    assert sorted(p.name for p in (tmp_path / "saved").iterdir()) == [
        "model.graphdef",
        "signature.json",
        "variables.safetensors",
    ]
    np.testing.assert_allclose(cg.load_model(tmp_path / "saved")(images), logits, rtol=1e-5, atol=1e-6)


def test_export_refuses_an_opset_it_does_not_write_as_a_bad_argument(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(
            ["export", "--checkpoint", str(tmp_path), "--model", "mlp", "--format", "onnx", "-o", "m", "--opset", "99"]
        )
    assert exit_.value.code == 2
    assert "cellgraph export: error: argument --opset: invalid choice: 99 (choose from 17, 18, 19, 20, 21)" in (
        capsys.readouterr().err
    )
