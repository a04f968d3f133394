"""``cellgraph train`` as a user runs it: a subprocess that trains, fails fast, or is interrupted, and leaves no process."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import psutil
import pytest

from cellgraph import cli

TIMEOUT = 300.0
# `python -m cellgraph` as a terminal's foreground job starts it: with SIGINT raising KeyboardInterrupt. Set here,
# because a process inherits an ignored SIGINT and Python then leaves it ignored: a test run started in the
# background of a shell without job control (`nohup ... &`, as some CI runners do) would lose the Ctrl-C.
FOREGROUND = (
    "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "runpy.run_module('cellgraph', run_name='__main__', alter_sys=True)"
)


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str
    leftover: list[str]  # processes the CLI started that outlived it (killed by the helper after noting them)


def run_cli(*args: str, timeout: float = TIMEOUT, interrupt_when: str | None = None) -> Ran:
    """Run ``python -m cellgraph *args`` in its own process group, watching every process it starts.

    With ``interrupt_when``, the whole group gets SIGINT (a terminal's Ctrl-C) once that text is on stdout.
    """
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    # faulthandler prints every thread's stack on SIGABRT: what a hung CLI waits for goes into the failure.
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"}
    seen: dict[int, psutil.Process] = {}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-c", FOREGROUND, *args], stdout=out, stderr=err, text=True, env=env,
            start_new_session=True,
        )  # fmt: skip
        interrupted = False
        try:
            while proc.poll() is None:
                if time.monotonic() - start > timeout:
                    raise AssertionError(
                        f"cellgraph {' '.join(args)} still running after {timeout} s "
                        f"({'interrupted' if interrupted else 'not interrupted'}); its threads:\n"
                        f"{_stacks(proc, err)}\nstdout:\n{_read(out)}"
                    )
                try:
                    for child in psutil.Process(proc.pid).children(recursive=True):
                        seen.setdefault(child.pid, child)
                except psutil.NoSuchProcess:
                    pass
                if interrupt_when and not interrupted:
                    out.seek(0)
                    if interrupt_when in out.read():
                        os.killpg(proc.pid, signal.SIGINT)
                        interrupted = True
                time.sleep(0.1)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        _, alive = psutil.wait_procs(list(seen.values()), timeout=10)
        leftover = [f"{p.pid} {' '.join(p.cmdline())[:120]}" for p in alive]
        for p in alive:
            p.kill()
        out.seek(0)
        err.seek(0)
        ran = Ran(proc.returncode, out.read(), err.read(), leftover)
    after = {p.pid for p in me.children(recursive=True)}
    assert after <= before, f"new children of the test process after the CLI exited: {after - before}"
    if interrupt_when:
        assert interrupted, f"{interrupt_when!r} never appeared on stdout:\n{ran.stdout}\n{ran.stderr}"
    return ran


def _read(file: IO[str]) -> str:
    file.seek(0)
    return file.read()


def _stacks(proc: subprocess.Popen[str], err: IO[str]) -> str:
    """The CLI's stderr after SIGABRT, which makes faulthandler print every thread's stack, then ends it."""
    proc.send_signal(signal.SIGABRT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)
    return _read(err)[-20_000:]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_train_mlp_reaches_its_target_and_leaves_nothing_running(tmp_path: Path) -> None:
    ran = run_cli(
        "train", "--model", "mlp", "--steps", "200", "--workers", "2", "--ps", "1", "--mode", "sync",
        "--batch-size", "64", "--checkpoint-dir", str(tmp_path), "--no-progress", "--check",
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "mlp: test accuracy" in ran.stdout and "(target 97%, met)" in ran.stdout
    assert "Summary: 200 global steps of mlp (sync mode, each step averaging 2 of 2 replicas'" in ran.stdout
    assert f"final checkpoint {tmp_path}" in ran.stdout and (tmp_path / "ckpt-0000000200").is_dir()
    assert "job and cluster shut down" in ran.stdout
    assert ran.leftover == []


@pytest.mark.slow
def test_ctrl_c_shuts_the_job_and_the_cluster_down() -> None:
    ran = run_cli("train", "--model", "mlp", "--steps", "1000000", "--no-progress", interrupt_when="job job-")
    assert ran.returncode == 130, ran.stdout + ran.stderr
    assert "cellgraph train: interrupted; the job and the cluster are shut down" in ran.stderr
    assert ran.leftover == []


@pytest.mark.slow
def test_an_unreachable_scheduler_fails_naming_it_and_the_reason() -> None:
    address = f"tcp://127.0.0.1:{closed_port()}"
    # 60 s only bounds a hang: the behaviour asserted is the message naming the scheduler and why (refused at once).
    ran = run_cli("train", "--model", "mlp", "--scheduler", address, "--no-progress", timeout=60)
    assert ran.returncode == 2, ran.stdout + ran.stderr
    assert (
        f"cellgraph train: error: could not reach the Dask scheduler at {address}: the connection was refused: "
        f"nothing listens on port {address.rsplit(':', 1)[1]} of 127.0.0.1"
    ) in ran.stderr
    assert ran.leftover == []


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--replicas", "3"], "--replicas 3 needs 3 training workers and --workers is 2: raise --workers"),
        (["--mode", "async", "--replicas-to-aggregate", "1"], "--replicas-to-aggregate is for --mode sync"),
        (["--replicas-to-aggregate", "3"], "--replicas-to-aggregate 3 is more than the 2 replicas"),
        (["--batch-size", "1000"], "--batch-size 1000 is larger than a replica's shard (719 rows"),
        (["--steps", "0"], "argument --steps: expected a positive int, got '0'"),
        (["--lr", "fast"], "argument --lr: expected a positive float, got 'fast'"),
        (["--scheduler", "nonsense"], "'nonsense' is not a scheduler address (missing port number"),
        (["--scheduler", "tcp://h:1", "--workers", "3"], "--workers starts local worker processes"),
        (["--model", "vgg16"], "argument --model: invalid choice: 'vgg16'"),
        (["--mode", "sometimes"], "argument --mode: invalid choice: 'sometimes'"),
        (
            ["--optimizer", "lamb"],
            "argument --optimizer: invalid choice: 'lamb' (choose from 'sgd', 'momentum', 'adam', 'rmsprop', 'adagrad', 'adamw', 'adamax', 'nadam', 'adadelta')",
        ),
    ],
)
def test_bad_arguments_exit_2_with_one_line(args: list[str], words: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["train", *args])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("cellgraph train: error: ") and words in err, err
    assert err.count("\n") == 1 and err.endswith("(see cellgraph train --help)\n")


def test_the_optimizer_and_its_rate_come_from_the_registry() -> None:
    from cellgraph.examples.distributed import Settings, optimizer_for

    assert repr(optimizer_for(Settings(model="mlp", optimizer="rmsprop", lr=0.01))) == (
        "RMSProp(learning_rate=0.01, decay=0.9, momentum=0.0, epsilon=1e-10)"
    )
    assert repr(optimizer_for(Settings(model="mlp", optimizer="adagrad"))) == (
        "Adagrad(learning_rate=0.01, initial_accumulator_value=0.1, epsilon=1e-07)"
    )
    assert optimizer_for(Settings(model="inception")).learning_rate == 3e-3  # Adam: the model's tuned rate


@pytest.mark.slow
def test_scheduler_runs_the_job_on_an_existing_cluster_and_leaves_it_running() -> None:
    from distributed import Client, LocalCluster

    # Workers without the Dask resources 'ps'/'worker': the command makes the first one the PS (--ps 1).
    with LocalCluster(n_workers=3, threads_per_worker=1, host="127.0.0.1", dashboard_address="127.0.0.1:0") as local:
        ran = run_cli(
            "train", "--model", "mlp", "--steps", "100", "--scheduler", local.scheduler_address, "--no-progress",
        )  # fmt: skip
        assert ran.returncode == 0, ran.stdout + ran.stderr
        assert f"cluster: connected at {local.scheduler_address}, 1 PS + 2 training worker(s)" in ran.stdout
        assert "Summary: 100 global steps of mlp" in ran.stdout
        # It says what it closed: its job, not the cluster someone else started.
        assert "; job closed in " in ran.stdout and "job and cluster shut down" not in ran.stdout
        assert f"s; the cluster at {local.scheduler_address} is left running (this command did not start it)." in (
            ran.stdout
        )
        with Client(local.scheduler_address, timeout=30) as client:
            assert len(client.scheduler_info(n_workers=-1)["workers"]) == 3  # the cluster is not the command's to close
