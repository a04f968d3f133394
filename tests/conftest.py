"""Test-session policy: the CUDA column (tests marked ``cuda``), and which skips a CI run allows.

``NUMBA_ENABLE_CUDASIM`` is read once, when ``numba.cuda`` is imported, so it
must be in the environment before the test process starts; this file does not
set it. A ``cuda`` test runs on a real GPU when ``numba.cuda`` sees one, on
Numba's simulator when ``NUMBA_ENABLE_CUDASIM=1``, and is skipped, with that
reason, when neither holds. The plain run still checks the column on the
simulator: ``tests/test_cuda_on_simulator.py`` runs ``pytest -m cuda`` in a
subprocess with the simulator on, and fails if any of them skips there.

A skipped test is a test that did not check anything, so CI (``.ci/run``,
which sets ``CELLGRAPH_STRICT_SKIPS=1``) fails the run when a test skips, or is
marked xfail, for any reason not in ``ALLOWED_SKIPS``; the summary names each
such test and its reason. Without that variable a skip is reported (``-ra``)
and the run's outcome is pytest's own: a machine without PyTorch or Chromium
can still run the rest.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import pytest

import cellgraph.cluster.ps  # noqa: F401  (first, as in a user's process: it keeps gRPC's fork handlers off)
from cellgraph.examples import digits

NO_CUDA = (
    "no CUDA GPU visible to numba.cuda and NUMBA_ENABLE_CUDASIM is not 1: "
    "run `NUMBA_ENABLE_CUDASIM=1 pytest -m cuda` to use Numba's CUDA simulator"
)
ON_SIMULATOR = "this process runs on the simulator: its cuda-marked tests run directly"

# The only reasons a CI run may skip a test for, each with why that skip hides nothing. Exact texts, not patterns:
# a new reason is a decision to make here, in review. Missing PyTorch, Chromium, iproute2 or root are not on it:
# CI installs them (.ci/run), so such a skip means the tests meant to run did not.
ALLOWED_SKIPS: Mapping[str, str] = {
    NO_CUDA: "no GPU on the CI machine: tests/test_cuda_on_simulator.py runs every cuda test on the simulator "
    "in a subprocess and fails if any of them skips there",
    ON_SIMULATOR: "the whole run is on the simulator (NUMBA_ENABLE_CUDASIM=1), so the cuda tests that the "
    "skipped test would run in a subprocess run in this process instead",
}
STRICT_SKIPS_ENV = "CELLGRAPH_STRICT_SKIPS"


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("cuda") is None:
        return
    from cellgraph.dataflow.kernels import cuda

    if not cuda.available():
        pytest.skip(NO_CUDA)


@pytest.fixture(scope="session")
def data() -> digits.Split:
    """The digits data set, split 80/20 with seed 0 (the training tests' data)."""
    return digits.load()


# ---------------------------------------------------------------------- the skip policy
@dataclass(frozen=True)
class Skip:
    """A test (or a whole module, skipped while it was collected) that did not run, and why."""

    nodeid: str
    reason: str


def skip_of(report: pytest.TestReport | pytest.CollectReport) -> Skip | None:
    """The skip a report records (an xfail counts: its test did not pass), or None."""
    if not report.skipped and not hasattr(report, "wasxfail"):
        return None
    if hasattr(report, "wasxfail"):
        return Skip(report.nodeid, f"xfail: {report.wasxfail}" if report.wasxfail else "xfail")
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        message = str(longrepr[2])
        return Skip(report.nodeid, message.removeprefix("Skipped: "))
    return Skip(report.nodeid, str(longrepr))


def unlisted(skips: Iterable[Skip], allowed: Mapping[str, str] = ALLOWED_SKIPS) -> list[Skip]:
    """The skips whose reason is not one of ``allowed``, in the order they happened."""
    return [skip for skip in skips if skip.reason not in allowed]


class SkipPolicy:
    """Records every skip of the session; with ``strict``, a skip not in ``ALLOWED_SKIPS`` fails the run."""

    def __init__(self, strict: bool) -> None:
        self.strict = strict
        self.skips: list[Skip] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        skip = skip_of(report)
        if skip is not None:
            self.skips.append(skip)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        skip = skip_of(report)  # pytest.importorskip at module level: none of the module's tests exist
        if skip is not None:
            self.skips.append(skip)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.strict and unlisted(self.skips) and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        bad = unlisted(self.skips)
        if not (self.strict and bad):
            return
        terminalreporter.section(f"skips not allowed ({STRICT_SKIPS_ENV}=1)", sep="=", red=True, bold=True)
        for skip in bad:
            terminalreporter.line(f"{skip.nodeid}: {skip.reason}", red=True)
        terminalreporter.line(
            f"{len(bad)} test(s) meant to run did not: install what they need (.ci/run installs it), make them "
            "run, or, if the skip hides nothing, add its reason to ALLOWED_SKIPS in tests/conftest.py saying why"
        )


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(SkipPolicy(os.environ.get(STRICT_SKIPS_ENV) == "1"), "cellgraph-skip-policy")
