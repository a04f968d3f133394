"""``cellgraph demo`` on a fresh machine and again (issue 18, item 16): cold_s <= 60 and warm_s <= 30 on 2 cores.

Runs the demo as a new user would (``cellgraph demo``: the mini-Inception on
an embedded cluster of 1 PS and 2 training workers) twice, each in a process
of its own: first with empty caches (Numba's and cellgraph's, pointed at a
new temporary folder with ``NUMBA_CACHE_DIR`` and ``CELLGRAPH_CACHE_DIR``),
every kernel compiled; then with the caches the first run left. Each time
is the command's whole run, from start to exit. ``--quick`` runs the demo's
MLP (``--model mlp``: fewer kernels, fewer steps); its figures are not the
targets' and say so.

    python benchmarks/cold_start.py [--quick] [--keep-cache]

The last line of stdout is the result as JSON.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, machine, parser, setup_threads, source  # noqa: E402

TARGET_COLD_S = 60.0
TARGET_WARM_S = 30.0
RUN_TIMEOUT_S = 900.0  # one demo run past this is a failure, not a figure
COMPILING = re.compile(r"compiling kernels (\d+)")


def run_demo(model: str | None, env: dict[str, str]) -> dict[str, Any]:
    """One ``cellgraph demo`` in a process of its own: its wall time, exit status and what it said."""
    command = [sys.executable, "-m", "cellgraph", "demo", *(["--model", model] if model else [])]
    began = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    seconds = time.perf_counter() - began
    output = done.stdout + done.stderr
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}:\n{output[-4000:]}")
    compiled = [int(n) for n in COMPILING.findall(output)]
    accuracy = re.search(r"test accuracy ([0-9.]+)%", output)
    return {
        "seconds": seconds,
        "kernels_compiled_shown": max(compiled, default=0),
        "test_accuracy": float(accuracy.group(1)) / 100 if accuracy else None,
        "tail": output.strip().splitlines()[-3:],
    }


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--keep-cache", action="store_true", help="leave the temporary cache folder (its path is printed)")
    args = p.parse_args()
    setup_threads(args.threads)
    model = "mlp" if args.quick else None
    folder = Path(tempfile.mkdtemp(prefix="cellgraph-cold-start-"))
    env = {
        **os.environ,
        "NUMBA_CACHE_DIR": str(folder / "numba"),
        "CELLGRAPH_CACHE_DIR": str(folder / "cellgraph"),
        "PYTHONUNBUFFERED": "1",
    }
    try:
        cold = run_demo(model, env)
        print(f"cold: {cold['seconds']:.1f} s (empty caches in {folder}); " + " | ".join(cold["tail"]))
        warm = run_demo(model, env)
        print(f"warm: {warm['seconds']:.1f} s (the caches the cold run left); " + " | ".join(warm["tail"]))
    finally:
        if args.keep_cache:
            print(f"caches kept in {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)
    what = "cellgraph demo" + (f" --model {model}" if model else "")
    print(
        f"\n{what}, {os.cpu_count()} cores:\n"
        f"  cold_s  {cold['seconds']:6.1f}   (target <= {TARGET_COLD_S:g}{', for the default model' if model else ''})\n"
        f"  warm_s  {warm['seconds']:6.1f}   (target <= {TARGET_WARM_S:g}{', for the default model' if model else ''})"
    )
    emit(
        {
            "benchmark": "cold_start",
            "command": what,
            "cold_s": cold["seconds"],
            "warm_s": warm["seconds"],
            "target_cold_s": TARGET_COLD_S,
            "target_warm_s": TARGET_WARM_S,
            # Met only for the default model: --quick trains the MLP.
            "cold_met": None if model else cold["seconds"] <= TARGET_COLD_S,
            "warm_met": None if model else warm["seconds"] <= TARGET_WARM_S,
            "kernels_compiled_shown": cold["kernels_compiled_shown"],
            "cold_test_accuracy": cold["test_accuracy"],
            "warm_test_accuracy": warm["test_accuracy"],
            "threads": args.threads,
            "quick": args.quick,
            "machine": machine(),
            "source": source(),
        }
    )


if __name__ == "__main__":
    main()
