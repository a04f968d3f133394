"""The main job: ``cellgraph demo`` trains the mini-Inception on a local Dask cluster; ``--local`` in one process."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cellgraph import cli
from tests.cluster.test_cli_train import run_cli


@pytest.mark.slow
def test_demo_trains_the_mini_inception_on_a_local_cluster_to_its_target() -> None:
    ran = run_cli("demo", "--check")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "cluster: local at tcp://127.0.0.1:" in ran.stdout and "1 PS + 2 training worker(s)" in ran.stdout
    assert "mini-inception, 400 steps in sync mode, 2 replica(s) of batch 64" in ran.stdout
    assert "mini-inception: test accuracy" in ran.stdout and "(target 98%, met)" in ran.stdout
    summary = next(line for line in ran.stdout.splitlines() if line.startswith("Summary: "))
    for words in ("400 global steps of mini-inception", "examples/s", "received", "MB", "final checkpoint /"):
        assert words in summary, summary
    # The progress bar (tqdm writes to stderr) is fed by the job's metrics.
    assert "training mini-inception" in ran.stderr and "loss=" in ran.stderr and "examples/s=" in ran.stderr
    assert ran.leftover == []


@pytest.mark.slow
def test_local_demo_reaches_both_accuracy_targets() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "cellgraph", "demo", "--local", "--no-progress", "--check"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "mlp: test accuracy" in out.stdout and "(target 97%, met)" in out.stdout
    assert "mini-inception: test accuracy" in out.stdout and "(target 98%, met)" in out.stdout
    assert "samples/s" in out.stdout and "first step (JIT compile or cache load)" in out.stdout


def test_demo_with_progress_bar_runs_one_epoch(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["demo", "--local", "--models", "mlp", "--epochs", "1"]) == 0
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
        cli.main(["demo", "--local", "--models", "vgg16"])
    assert "invalid choice: 'vgg16' (choose from" in capsys.readouterr().err


def test_local_only_options_without_local_say_to_add_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["demo", "--epochs", "1"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1
        and "cellgraph demo: error: --models and --epochs choose the single-process run: add --local" in err
    )


@pytest.mark.parametrize("rate", ["nan", "inf", "1e400"])
def test_a_learning_rate_that_is_not_a_finite_number_exits_2_with_one_line(
    rate: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # float() parses them: they reached the optimizer and ended in a traceback.
    with pytest.raises(SystemExit) as exit_:
        cli.main(["train", "--lr", rate])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"cellgraph train: error: argument --lr: expected a positive float, got {rate!r}" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--local", "--batch-size", "0"], "argument --batch-size: expected a positive int, got '0'"),
        (["--local", "--batch-size", "-5"], "argument --batch-size: expected a positive int, got '-5'"),
        (["--local", "--epochs", "-1"], "argument --epochs: expected a positive int, got '-1'"),
        (["--local", "--epochs", "0"], "argument --epochs: expected a positive int, got '0'"),
        (
            ["--local", "--batch-size", "100000"],
            "--batch-size 100000 is larger than the training set (1438 images): no step would run",
        ),
        (["--batch-size", "3"], "--batch-size sets the single-process run's rows per step: add --local"),
    ],
)
def test_demo_refuses_a_batch_size_or_epochs_that_would_train_no_step(
    args: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: --batch-size 0 ended in a traceback; -5, 100000 and --epochs -1 trained 0 (or -22) steps and printed
    a test accuracy with exit 0; --epochs 0 trained the default epochs; --batch-size without --local was ignored."""
    with pytest.raises(SystemExit) as exit_:
        cli.main(["demo", "--models", "mlp", "--no-progress", *args])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"cellgraph demo: error: {words}" in err and err.count("\n") == 1
