"""The plain test run checks the whole CUDA column too, on Numba's CUDA simulator.

``NUMBA_ENABLE_CUDASIM`` is read once, when ``numba.cuda`` is imported, so the
cuda-marked tests run in subprocesses that start with it set. Every one of
them must pass there: none may be skipped. The simulator runs kernels in
Python threads, on one core: the tests are split by file into one shard per
core, run side by side (the rest of the suite waits meanwhile).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Deadline of all the shards together: they run at once.
SHARDS_TIMEOUT_S = 1500


def shards(node_ids: list[str], count: int) -> list[list[str]]:
    """``node_ids`` in ``count`` groups of whole files, the files dealt largest first to the smallest group."""
    by_file: dict[str, list[str]] = {}
    for node in node_ids:
        by_file.setdefault(node.split("::", 1)[0], []).append(node)
    groups: list[list[str]] = [[] for _ in range(max(1, count))]
    for nodes in sorted(by_file.values(), key=len, reverse=True):
        min(groups, key=len).extend(nodes)
    return [group for group in groups if group]


def run_sharded(node_ids: list[str], count: int, env: dict[str, str]) -> list[tuple[int, str, str]]:
    """Run the tests in ``count`` pytest subprocesses at once; (return code, stdout, stderr) of each."""
    base = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs"]
    procs = [
        subprocess.Popen([*base, *group], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for group in shards(node_ids, count)
    ]
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=SHARDS_TIMEOUT_S)
            results.append((proc.returncode, out, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return results


def test_shards_keep_files_whole_and_lose_no_test() -> None:
    nodes = [f"tests/a.py::t{i}" for i in range(5)] + ["tests/b.py::t", "tests/c.py::t1", "tests/c.py::t2"]
    groups = shards(nodes, 2)
    assert sorted(n for g in groups for n in g) == sorted(nodes)
    assert [sorted({n.split("::")[0] for n in g}) for g in groups] == [["tests/a.py"], ["tests/b.py", "tests/c.py"]]
    assert shards(nodes, 8) == [nodes[:5], nodes[6:], nodes[5:6]]  # no empty shard


@pytest.mark.slow
def test_every_cuda_test_passes_on_the_simulator() -> None:
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        pytest.skip("this process runs on the simulator: its cuda-marked tests run directly")
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "cuda", "-p", "no:cacheprovider", "tests", "--collect-only", "-q"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    node_ids = [line for line in collected.stdout.splitlines() if "::" in line and not line.startswith(" ")]
    expected = re.search(r"(\d+)/\d+ tests collected|(\d+) tests? collected", collected.stdout)
    assert expected, collected.stdout[-2000:]
    assert len(node_ids) == int(expected.group(1) or expected.group(2)), collected.stdout[-2000:]
    passed = 0
    for code, out, err in run_sharded(node_ids, os.cpu_count() or 1, env):
        summary = out.strip().splitlines()[-1] if out.strip() else ""
        assert code == 0, out[-6000:] + err[-2000:]
        assert "skipped" not in summary, summary
        found = re.search(r"(\d+) passed", summary)
        passed += int(found.group(1)) if found else 0
    assert passed == len(node_ids), f"{passed} of the {len(node_ids)} cuda-marked tests passed"
