"""%export in a real IPython shell: a model of the notebook out as ONNX or a saved model; bad arguments refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from IPython.core.interactiveshell import InteractiveShell

import cellgraph as cg
from cellgraph.cluster.ps.checkpoint import write_shard_checkpoint
from cellgraph.cluster.ps.config import OptimizerConfig, TrainingConfig, VariableSpec

from .shells import ok, refused

MODEL = (
    "import cellgraph as cg\nimport numpy as np\n"
    "x = cg.placeholder((None, 4), name='x')\n"
    "logits = cg.layers.dense(x, 3, name='logits')\n"
    "session = cg.Session()\n"
    "X = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)\n"
    "want = session.run(logits, {x: X})"
)


def test_export_writes_onnx_from_a_session_in_the_notebook(shell: InteractiveShell, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    ok(shell, MODEL)
    path = tmp_path / "m.onnx"
    capsys.readouterr()
    ok(shell, f"%export logits --inputs x --from session --format onnx -o {path}")
    assert f"wrote the ONNX model (x:0 -> logits/bias_add:0) to {path}" in capsys.readouterr().out
    runtime = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = runtime.run(None, {"x": shell.user_ns["X"]})[0]
    np.testing.assert_allclose(got, shell.user_ns["want"], rtol=1e-5, atol=1e-6)


def test_export_writes_a_saved_model_of_an_example_model_from_a_checkpoint(
    shell: InteractiveShell, tmp_path: Path
) -> None:
    from cellgraph.examples import models

    values = cg.Session(models.mlp().graph).variable_values()
    write_shard_checkpoint(
        tmp_path / "ckpt", job_id="magic", shard=0, num_shards=1, global_step=1, tensors=values,
        versions=dict.fromkeys(values, 1), specs=[VariableSpec(k, v.dtype, v.shape) for k, v in values.items()],
        optimizer=OptimizerConfig(), training=TrainingConfig(),
    )  # fmt: skip
    ok(shell, f"%export --model mlp --checkpoint {tmp_path / 'ckpt'} --format saved -o {tmp_path / 'saved'}")
    model = cg.load_model(tmp_path / "saved")
    x = np.ones((2, 64), np.float32)
    h = np.maximum(x @ values["hidden/kernel"] + values["hidden/bias"], 0)
    np.testing.assert_allclose(model(x), h @ values["logits/kernel"] + values["logits/bias"], rtol=1e-5)


def test_a_path_ending_in_onnx_is_written_as_onnx_without_format(
    shell: InteractiveShell, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """'%export out --inputs x -o model.onnx' said '--format (onnx or saved) and -o PATH are both needed'."""
    ok(shell, MODEL)
    path = tmp_path / "m.onnx"
    capsys.readouterr()
    ok(shell, f"%export logits --inputs x --from session -o {path}")
    assert f"wrote the ONNX model (x:0 -> logits/bias_add:0) to {path}" in capsys.readouterr().out
    runtime = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(runtime.run(None, {"x": shell.user_ns["X"]})[0], shell.user_ns["want"], rtol=1e-5)


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("%export logits --inputs x -o m", "--format is needed (onnx or saved): -o 'm' does not end in .onnx"),
        ("%export logits --inputs x --format saved", "-o PATH is needed: the .onnx file or the saved model's folder"),
        ("%export --format onnx -o m.onnx", "name OUTPUTS and --inputs (or --model NAME for an example model)"),
        ("%export logits --inputs nope --format onnx -o m.onnx", "--inputs 'nope' is not defined in the notebook"),
        ("%export X --inputs x --format onnx -o m.onnx", "OUTPUTS 'X' is a ndarray, not a cg.Tensor"),
        ("%export logits --inputs x --format onnx -o m.onnx", "no values to export: give --checkpoint DIR"),
        ("%export --model vgg16 --format onnx -o m.onnx --from session", "--model 'vgg16' is not one of inception, inception_v3, lstm, mlp, resnet, transformer"),
        ("%export logits --inputs x --format onnx -o m.onnx --from session --checkpoint d", "give --checkpoint or --from, not both"),
    ],
)  # fmt: skip
def test_bad_arguments_are_refused_with_the_usage(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str], tmp_path: Path, line: str, words: str
) -> None:
    ok(shell, MODEL)
    shell.user_ns.pop("job", None)
    err = refused(shell, capsys, line)
    assert words in err and "usage: %export" in err
    assert not Path("m.onnx").exists()


def test_an_export_error_names_the_problem(shell: InteractiveShell, capsys: pytest.CaptureFixture[str]) -> None:
    ok(shell, MODEL)
    ok(shell, "values = {}")
    err = refused(shell, capsys, "%export logits --inputs x --from values --format saved -o m")
    assert "%export: variable 'logits/kernel' has no value in the dict (it holds: none)" in err
