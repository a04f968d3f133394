"""The CI skip policy (tests/conftest.py): a skip whose reason is not allowed fails a strict run, naming it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ALLOWED_SKIPS, NO_CUDA, STRICT_SKIPS_ENV, Skip, SkipPolicy, skip_of, unlisted

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 120.0  # for a small pytest run in a subprocess (importing cellgraph on a busy machine)


def report(
    outcome: str, longrepr: object, nodeid: str = "tests/test_x.py::test_a", **extra: object
) -> pytest.TestReport:
    return pytest.TestReport(nodeid, ("tests/test_x.py", 1, "test_a"), {}, outcome, longrepr, "setup", **extra)  # type: ignore[arg-type]


def test_skip_of_reads_the_reason_of_each_kind_of_report() -> None:
    assert skip_of(report("passed", None)) is None
    assert skip_of(report("failed", "boom")) is None
    assert skip_of(report("skipped", ("tests/conftest.py", 30, f"Skipped: {NO_CUDA}"))) == Skip(
        "tests/test_x.py::test_a", NO_CUDA
    )
    assert skip_of(report("skipped", ("x.py", 1, "could not import 'torch': No module named 'torch'"))) == Skip(
        "tests/test_x.py::test_a", "could not import 'torch': No module named 'torch'"
    )
    assert skip_of(report("skipped", None, wasxfail="flaky")) == Skip("tests/test_x.py::test_a", "xfail: flaky")
    assert skip_of(report("passed", None, wasxfail="")) == Skip("tests/test_x.py::test_a", "xfail")  # xpassed
    module = pytest.CollectReport("tests/test_y.py", "skipped", ("tests/test_y.py", 9, "Skipped: no torch"), [])
    assert skip_of(module) == Skip("tests/test_y.py", "no torch")


def test_only_the_listed_reasons_pass() -> None:
    skips = [
        Skip("a", NO_CUDA),
        Skip("b", "torch is not installed; pip install torch==2.13.0"),
        Skip("c", NO_CUDA + " "),  # exact texts: a changed reason is a new one
        Skip("d", "xfail: flaky"),
    ]
    assert unlisted(skips) == skips[1:]
    assert unlisted(skips, allowed={}) == skips
    assert all(why.strip() for why in ALLOWED_SKIPS.values())  # each allowed reason says why it hides nothing
    assert len(ALLOWED_SKIPS) <= 3  # short, on purpose: a new entry is a decision to argue for


class Terminal:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def section(self, title: str, **_: object) -> None:
        self.lines.append(f"== {title}")

    def line(self, text: str, **_: object) -> None:
        self.lines.append(text)


class Session:
    def __init__(self, exitstatus: int) -> None:
        self.exitstatus = exitstatus


@pytest.mark.parametrize("strict", [True, False])
def test_the_policy_fails_a_strict_run_naming_each_unlisted_skip(strict: bool) -> None:
    policy = SkipPolicy(strict)
    policy.pytest_runtest_logreport(report("skipped", ("c.py", 30, f"Skipped: {NO_CUDA}"), "t::cuda"))
    policy.pytest_runtest_logreport(report("passed", None, "t::ok"))
    policy.pytest_collectreport(pytest.CollectReport("t_opt.py", "skipped", ("t_opt.py", 9, "Skipped: no torch"), []))
    session, terminal = Session(pytest.ExitCode.OK), Terminal()
    policy.pytest_sessionfinish(session)  # type: ignore[arg-type]
    policy.pytest_terminal_summary(terminal)  # type: ignore[arg-type]
    assert policy.skips == [Skip("t::cuda", NO_CUDA), Skip("t_opt.py", "no torch")]
    if strict:
        assert session.exitstatus == pytest.ExitCode.TESTS_FAILED
        assert terminal.lines[:2] == [f"== skips not allowed ({STRICT_SKIPS_ENV}=1)", "t_opt.py: no torch"]
        assert terminal.lines[2].startswith("1 test(s) meant to run did not:")
    else:
        assert session.exitstatus == pytest.ExitCode.OK and terminal.lines == []
    failed = Session(pytest.ExitCode.INTERRUPTED)
    policy.pytest_sessionfinish(failed)  # type: ignore[arg-type]
    assert failed.exitstatus == pytest.ExitCode.INTERRUPTED  # a worse outcome is kept


def test_a_strict_pytest_run_exits_non_zero_on_an_unlisted_skip(tmp_path: Path) -> None:
    """End to end: a real pytest run with this conftest as a plugin, on tests that skip for each kind of reason."""
    (tmp_path / "test_skips.py").write_text(
        "import pytest\n"
        "from tests.conftest import NO_CUDA\n"
        "def test_runs():\n    pass\n"
        "def test_no_gpu():\n    pytest.skip(NO_CUDA)\n"
        "def test_needs_torch():\n    pytest.skip('torch not installed: pip install torch==2.13.0')\n"
        "@pytest.mark.skipif(True, reason='not ready yet')\n"
        "def test_guarded():\n    pass\n"
    )
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest", str(tmp_path)]
    env = {key: value for key, value in os.environ.items() if key != STRICT_SKIPS_ENV}
    lenient = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert lenient.returncode == 0, lenient.stdout + lenient.stderr
    assert "1 passed, 3 skipped" in lenient.stdout and "skips not allowed" not in lenient.stdout

    strict = subprocess.run(
        command, cwd=ROOT, env={**env, STRICT_SKIPS_ENV: "1"}, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert strict.returncode == pytest.ExitCode.TESTS_FAILED, strict.stdout + strict.stderr
    section = strict.stdout.split(f"skips not allowed ({STRICT_SKIPS_ENV}=1)", 1)[1]
    assert "test_skips.py::test_needs_torch: torch not installed: pip install torch==2.13.0" in section
    assert "test_skips.py::test_guarded: not ready yet" in section
    assert "test_no_gpu" not in section and "2 test(s) meant to run did not" in section
