from __future__ import annotations

import subprocess
import sys

import pytest
from threadpoolctl import threadpool_info

import cellgraph as cg


def test_kernels_default_to_one_blas_thread_in_every_pool() -> None:
    code = (
        "import cellgraph as cg, numpy as np\n"
        "from threadpoolctl import threadpool_info\n"
        "g = cg.Graph()\n"
        "with g.as_default():\n"
        "    x = cg.placeholder((2, 2), name='x')\n"
        "    y = x @ x\n"
        "cg.Session(g).run(y, {x: np.eye(2)})\n"
        "print(cg.get_num_threads(), sorted({p['num_threads'] for p in threadpool_info() if p['user_api'] == 'blas'}))\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != "CELLGRAPH_NUM_THREADS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, check=True)
    assert out.stdout.strip() == "1 [1]"


def test_set_num_threads_changes_the_blas_pools() -> None:
    before = cg.get_num_threads()
    try:
        cg.set_num_threads(2)
        # OpenBLAS never runs more threads than there are cores.
        expected = min(2, __import__("os").cpu_count() or 1)
        assert {p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"} == {expected}
        assert cg.get_num_threads() == 2
    finally:
        cg.set_num_threads(before)


def test_bad_thread_counts_are_rejected() -> None:
    with pytest.raises(cg.CellgraphError, match=r"set_num_threads: n must be a positive int, got 0"):
        cg.set_num_threads(0)
    code = "import cellgraph as cg; cg.get_num_threads()"
    env = {**__import__("os").environ, "CELLGRAPH_NUM_THREADS": "many"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert "CELLGRAPH_NUM_THREADS must be a positive integer, got 'many'" in out.stderr
