"""The plain test run checks the whole CUDA column too, on Numba's CUDA simulator.

``NUMBA_ENABLE_CUDASIM`` is read once, when ``numba.cuda`` is imported, so the
cuda-marked tests run in a subprocess that starts with it set. Every one of
them must pass there: none may be skipped.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_every_cuda_test_passes_on_the_simulator() -> None:
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        pytest.skip("this process runs on the simulator: its cuda-marked tests run directly")
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    base = [sys.executable, "-m", "pytest", "-m", "cuda", "-p", "no:cacheprovider", "tests"]
    collected = subprocess.run(
        [*base, "--collect-only", "-q"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    expected = re.search(r"(\d+)/\d+ tests collected|(\d+) tests? collected", collected.stdout)
    assert expected, collected.stdout[-2000:]
    count = int(expected.group(1) or expected.group(2))
    proc = subprocess.run([*base, "-q", "-rs"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert f"{count} passed" in summary and "skipped" not in summary, summary
