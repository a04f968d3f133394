"""The plain test run checks the whole CUDA column too, on Numba's CUDA simulator.

``NUMBA_ENABLE_CUDASIM`` is read once, when ``numba.cuda`` is imported, so the
cuda-marked tests run in subprocesses that start with it set. Every one of
them must pass there: none may be skipped. The simulator runs kernels in
Python threads, on one core: the tests are split into one shard per core, run
side by side (this test's process waits meanwhile). A handful of tests take
most of the time, so the split weighs each test by its time on the simulator
(``SIMULATOR_S``) rather than counting tests: split by file, one shard got
nearly all the work.
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

# Seconds on the simulator of the cuda tests that take more than a few (measured on the 2-core CI
# machine, under load). A key names a test, or every parametrization of one (``test[...]``).
# The other tests take about 0.05 s each (DEFAULT_S). A stale key fails the run, so the table
# follows renames; a new slow test missing from it only makes the split less even.
SIMULATOR_S: dict[str, float] = {
    "tests/dataflow/test_partition.py::test_mini_inception_on_two_ps_tasks_and_a_gpu_worker_trains_like_one_device": 76,
    "tests/dataflow/test_cuda_models_ops.py::test_a_training_step_on_the_gpu_matches_the_cpu": 19,
    "tests/dataflow/test_cuda_matmul.py::test_conv2d_gradients_are_the_cpu_kernels": 13,
    "tests/dataflow/test_cuda_staging.py::test_a_training_step_pins_nothing_new_after_its_first": 12,
    "tests/dataflow/test_partition.py::test_cpu_and_gpu_partitions_train_like_one_device": 7,
    "tests/dataflow/test_cuda_matmul.py::test_batched_matmul_is_one_gemm_over_broadcast_operands": 5.5,
}
DEFAULT_S = 0.05


def cost(node_id: str, table: dict[str, float] = SIMULATOR_S) -> float:
    """Seconds ``node_id`` is expected to take on the simulator."""
    return table.get(node_id.split("[", 1)[0], DEFAULT_S)


def shards(node_ids: list[str], count: int, table: dict[str, float] = SIMULATOR_S) -> list[list[str]]:
    """``node_ids`` in ``count`` groups of about equal time: slowest first, each to the group with the least so far.

    Each group keeps the collection order, so a file's tests still run one after another.
    """
    groups: list[list[int]] = [[] for _ in range(max(1, count))]
    load = [0.0] * len(groups)
    for i in sorted(range(len(node_ids)), key=lambda i: -cost(node_ids[i], table)):  # stable: ties keep the order
        least = load.index(min(load))
        groups[least].append(i)
        load[least] += cost(node_ids[i], table)
    return [[node_ids[i] for i in sorted(group)] for group in groups if group]


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


def test_shards_balance_the_time_and_lose_no_test() -> None:
    table = {"tests/a.py::slow": 10.0, "tests/b.py::param": 2.0}
    nodes = ["tests/a.py::slow", *(f"tests/a.py::t{i}" for i in range(3)), "tests/b.py::param[1]"]
    nodes += ["tests/b.py::param[2]", *(f"tests/c.py::t{i}" for i in range(100))]
    groups = shards(nodes, 2, table)
    assert sorted(n for g in groups for n in g) == sorted(nodes)
    # The slow test has a shard to itself; the parametrized one (2 s each) and the 103 quick ones
    # (5.15 s together) make up the other's 9.15 s; each shard runs its tests in the collection order.
    assert groups[0] == ["tests/a.py::slow"]
    assert sum(cost(n, table) for n in groups[1]) == pytest.approx(4.0 + 0.05 * 103)
    assert all(g == [n for n in nodes if n in g] for g in groups)
    assert shards(nodes[:2], 8, table) == [["tests/a.py::slow"], ["tests/a.py::t0"]]  # no empty shard


def _collect_cuda_tests(env: dict[str, str]) -> list[str]:
    """The node ids of every cuda-marked test, as a process on the simulator collects them."""
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
    return node_ids


@pytest.mark.slow
def test_every_cuda_test_passes_on_the_simulator() -> None:
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        pytest.skip("this process runs on the simulator: its cuda-marked tests run directly")
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    node_ids = _collect_cuda_tests(env)
    stale = set(SIMULATOR_S) - {node.split("[", 1)[0] for node in node_ids}
    assert not stale, f"SIMULATOR_S names tests that are not cuda tests (renamed?): {sorted(stale)}"
    passed = 0
    for code, out, err in run_sharded(node_ids, os.cpu_count() or 1, env):
        summary = out.strip().splitlines()[-1] if out.strip() else ""
        assert code == 0, out[-6000:] + err[-2000:]
        assert "skipped" not in summary, summary
        found = re.search(r"(\d+) passed", summary)
        passed += int(found.group(1)) if found else 0
    assert passed == len(node_ids), f"{passed} of the {len(node_ids)} cuda-marked tests passed"
