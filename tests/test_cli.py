"""The main job: ``cellgraph demo`` trains both digits models to their targets."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cellgraph import cli


@pytest.mark.slow
def test_demo_reaches_both_accuracy_targets() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "cellgraph", "demo", "--no-progress", "--check"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "mlp: test accuracy" in out.stdout and "(target 97%, met)" in out.stdout
    assert "mini-inception: test accuracy" in out.stdout and "(target 98%, met)" in out.stdout
    assert "samples/s" in out.stdout and "first step (JIT compile or cache load)" in out.stdout


def test_demo_with_progress_bar_runs_one_epoch(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["demo", "--models", "mlp", "--epochs", "1"]) == 0
    captured = capsys.readouterr()
    assert "mlp: test accuracy" in captured.out
    assert "training mlp" in captured.err  # tqdm writes its bar to stderr


def test_demo_without_the_examples_extra_says_what_to_install() -> None:
    # A None entry in sys.modules makes `import sklearn` fail as if it were not installed.
    code = "import sys; sys.modules['sklearn'] = None\nfrom cellgraph.cli import main\nsys.exit(main(['demo']))\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert (
        "cellgraph demo needs the examples extra (sklearn is missing): pip install 'cellgraph[examples]'" in out.stderr
    )


def test_unknown_model_is_rejected_with_choices(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["demo", "--models", "resnet"])
    assert "invalid choice: 'resnet' (choose from" in capsys.readouterr().err
