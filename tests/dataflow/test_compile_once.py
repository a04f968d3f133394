"""A kernel is compiled once per machine (issue 18, item 16): processes that need it at once take turns on its
cache's lock, so one compiles and the others load what it wrote. Asserted through each process's counters and the
files in the cache, never through timings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from numba import njit

from cellgraph.dataflow.kernels import compile_once as compile_once_module
from cellgraph.dataflow.kernels.compile_once import CompileEvent, add_listener, compile_once

HANG_S = 240.0  # a hang guard only: far longer than two compiles of one small kernel on a loaded machine

# A kernel of its own, in a file of its own: no other test or process has it in a cache.
KERNEL_SOURCE = """
import math

from cellgraph.dataflow.kernels.cpu import kernel


@kernel
def mix(x, y, out):
    for i in range(x.shape[0]):
        a, b = x[i], y[i]
        if a > b:
            out[i] = math.sqrt(a * a + b * b) + math.sin(a) * math.cos(b)
        elif a < -b:
            out[i] = math.exp(-abs(a)) * math.log1p(abs(b)) - math.tanh(a - b)
        else:
            out[i] = math.atan2(a, b + 1.5) + math.erf(a) * math.erfc(b) + math.hypot(a, b)
    return out
"""

# Each process: wait for the go, call the kernel, print what this process did.
CHILD = """
import json, sys, time
from pathlib import Path
import numpy as np
sys.path.insert(0, sys.argv[1])
import mixkernel
from cellgraph.dataflow.kernels.compile_once import counts
folder = Path(sys.argv[1])
(folder / f"ready-{sys.argv[2]}").touch()
deadline = time.monotonic() + 120
while not (folder / "go").exists():
    assert time.monotonic() < deadline, "no go"
    time.sleep(0.001)
x = np.linspace(-2, 2, 16)
out = mixkernel.mix(x, x[::-1].copy(), np.empty(16))
print(json.dumps({"compiled": counts.compiled, "loaded": counts.loaded, "waited": counts.waited,
                  "sum": float(out.sum())}))
"""


def test_two_processes_that_need_a_new_kernel_at_once_compile_it_once(tmp_path: Path) -> None:
    (tmp_path / "mixkernel.py").write_text(KERNEL_SOURCE)
    cache = tmp_path / "numba-cache"
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache)}
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(tmp_path), str(i)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    try:
        deadline = time.monotonic() + HANG_S
        # Both processes have imported everything and wait: the go makes them ask for the kernel together.
        while not all((tmp_path / f"ready-{i}").exists() for i in range(2)):
            assert time.monotonic() < deadline, "the processes never got ready"
            assert all(c.poll() is None for c in children), [c.communicate() for c in children]
            time.sleep(0.01)
        (tmp_path / "go").touch()
        outcomes = []
        for child in children:
            out, err = child.communicate(timeout=HANG_S)
            assert child.returncode == 0, err
            outcomes.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    # One compiled the kernel and wrote its cache; the other waited for its lock and loaded that.
    assert sorted((o["compiled"], o["loaded"]) for o in outcomes) == [(0, 1), (1, 0)], outcomes
    loader = next(o for o in outcomes if o["loaded"])
    assert loader["waited"] == 1, outcomes
    assert outcomes[0]["sum"] == outcomes[1]["sum"]
    locks = sorted(p.name for p in cache.rglob("*.lock"))
    assert [name.split("-")[0] for name in locks] == ["mixkernel.mix"], locks
    assert len(list(cache.rglob("mixkernel.mix-*.nbi"))) == 1 and list(cache.rglob("mixkernel.mix-*.nbc"))


def test_listeners_hear_each_signature_compiled_or_loaded_once(tmp_path: Path) -> None:
    heard: list[CompileEvent] = []
    remove = add_listener(heard.append)
    try:
        # Without a cache (cache=False) there is nothing to share: no lock, and no event either.
        plain = compile_once(njit(cache=False)(lambda x: x + 1))
        assert plain(1) == 2 and heard == []
        before = compile_once_module.counts.compiled + compile_once_module.counts.loaded
        source = tmp_path / "twice.py"
        source.write_text(
            "from cellgraph.dataflow.kernels.cpu import kernel\n\n\n@kernel\ndef twice(x):\n    return 2 * x\n"
        )
        sys.path.insert(0, str(tmp_path))
        try:
            import twice  # type: ignore[import-not-found]
        finally:
            sys.path.remove(str(tmp_path))
        assert twice.twice(2) == 4 and twice.twice(3) == 6  # one signature (int64): one event
        assert twice.twice(1.5) == 3.0  # a second signature (float64): a second one
        assert [(e.kernel, e.how) for e in heard] == [("twice.twice", heard[0].how), ("twice.twice", heard[1].how)]
        assert compile_once_module.counts.compiled + compile_once_module.counts.loaded == before + 2
    finally:
        remove()
        sys.modules.pop("twice", None)
