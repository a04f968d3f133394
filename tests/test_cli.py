"""The main job: ``cellgraph demo`` trains the mini-Inception on a local Dask cluster; ``--local`` in one process."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

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


def _train_fails_fast(checkpoint_dir: str, **options: object) -> subprocess.CompletedProcess[str]:
    """``cellgraph train --checkpoint-dir checkpoint_dir`` through the real entry point: it must exit 2 before
    a cluster starts (a clear error came only after the cluster had started, 28 s in)."""
    args = [sys.executable, "-m", "cellgraph", "train", "--no-progress", "--checkpoint-dir", checkpoint_dir]
    out = subprocess.run(args, capture_output=True, text=True, timeout=120, **options)  # type: ignore[call-overload]
    assert out.returncode == 2, out
    assert out.stdout == "" and "starting" not in out.stderr and "Traceback" not in out.stderr, out
    return out  # type: ignore[no-any-return]


def test_train_refuses_a_checkpoint_dir_that_is_a_file_before_starting_anything(tmp_path: Path) -> None:
    a_file = tmp_path / "notes.txt"
    a_file.write_text("not a folder")
    err = _train_fails_fast(str(a_file)).stderr
    assert f"cellgraph train: error: --checkpoint-dir {a_file} is a file, not a folder: give a folder" in err
    err = _train_fails_fast(str(a_file / "ckpt")).stderr
    assert f"--checkpoint-dir {a_file / 'ckpt'} cannot be made: {a_file} is a file, not a folder" in err
    assert a_file.read_text() == "not a folder"


def test_train_refuses_a_checkpoint_dir_it_cannot_write_before_starting_anything(tmp_path: Path) -> None:
    # Root may write anywhere, so as root a forked child runs the real main() as nobody (65534) (that user cannot
    # run this venv's python); otherwise the folder's mode suffices. Only the exit code and stderr come back.
    import sklearn  # noqa: F401
    import tqdm  # noqa: F401

    import cellgraph.examples.distributed  # noqa: F401  (imported here: the child may not read the files)

    top = Path(tempfile.mkdtemp(prefix="cellgraph-cli-"))
    top.chmod(0o755)
    locked = top / "locked"
    locked.mkdir(mode=0o555)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 99
        try:
            sys.stderr = os.fdopen(write, "w", buffering=1)  # pytest captures sys.stderr, not fd 2
            if os.geteuid() == 0:
                os.setgid(65534)
                os.setuid(65534)
            cli.main(["train", "--no-progress", "--checkpoint-dir", str(locked / "ckpt")])
        except SystemExit as exit_:
            code = int(exit_.code or 0)
        finally:
            sys.stderr.flush()
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as pipe:
        err = pipe.read()
    _, status = os.waitpid(pid, 0)
    try:
        assert os.waitstatus_to_exitcode(status) == 2, err
        assert "starting" not in err and "Traceback" not in err, err
        assert f"--checkpoint-dir {locked / 'ckpt'} is not writable: this user cannot write into {locked}" in err
        assert not (locked / "ckpt").exists()
    finally:
        locked.chmod(0o755)
        shutil.rmtree(top)
