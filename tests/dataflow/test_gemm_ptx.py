"""What the GEMM compiles to on a GPU, read in its PTX without one (``benchmarks/gpu_ptx.py``).

The kernel's speed on a GPU rests on one thing the simulator cannot show: each
thread's shared-memory reads are 16-byte vector loads, four float32 (two
float64) values each, not one load per value (``gemm.py``: one scalar load
for every 4 FMAs held it to 0.45 of cuBLAS). Whether LLVM merged them is
written in the PTX, which NVIDIA's NVRTC and NVVM compile on any machine: CI
installs them (``.ci/run``), as it installs PyTorch for the oracle tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from gpu_ptx import NVRTC_HINT, counts, tile_loop  # noqa: E402

TIMEOUT_S = 600.0  # six kernels compiled on a busy 2-core machine (about 40 s alone)

PTX = """
.visible .entry gemm(
	ld.shared.f32 	%f1, [%rd9];
	bar.sync 	0;
$L__BB0_3:
	@%p140 bra 	$L__BB0_93;
	add.s64 	%rd739, %rd129, %rd6;
	mul.lo.s64 	%rd746, %rd130, %rd218;
	ld.global.f32 	%f1841, [%rd745];
	ld.shared.v4.f32 	{%f1, %f2, %f3, %f4}, [%rd774];
	ld.shared.v4.f32 	{%f5, %f6, %f7, %f8}, [%rd774+256];
	ld.shared.f32 	%f9, [%rd769];
	fma.rn.f32 	%f482, %f481, %f480, %f1918;
	fma.rn.f32 	%f484, %f481, %f483, %f1917;
	@%p2 st.shared.f32 	[%rd1], %f9;
	bar.sync 	0;
	st.global.f32 	[%rd2], %f482;
"""


def test_counts_read_the_tile_loop_alone() -> None:
    # The scalar load before the first barrier (the first tile's) and the store after the second are not counted.
    assert counts(PTX) == {
        "fma": 2,
        "shared_loads_scalar": 1,
        "shared_loads_vector": 2,
        "shared_stores": 1,
        "global_loads": 1,
        "integer_ops": 2,
    }
    with pytest.raises(ValueError, match="expected two barriers in the GEMM's PTX, found 0"):
        tile_loop("ld.shared.f32 %f1, [%rd9];")


@pytest.mark.slow
def test_each_shared_read_of_the_gemm_is_a_16_byte_vector_load() -> None:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}  # compile_ptx needs the real target
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / "gpu_ptx.py")],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=env,
        cwd=BENCHMARKS.parent,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if "skipped" in result:
        assert NVRTC_HINT in result["skipped"]
        pytest.skip(f"NVIDIA's NVRTC and NVVM are not installed; {NVRTC_HINT}")
    from cellgraph.dataflow.kernels.cuda.gemm import SMALL, TIMED

    assert len(result["tiles"]) == len(TIMED) + 1  # and float64's SMALL
    for name, found in result["tiles"].items():
        dtype, shape = name.split(" ")
        tiles = next(t for t in (*TIMED, SMALL) if shape.startswith(f"{t.bm}x{t.bn}x{t.bk}/{t.tm}x{t.tn}"))
        per_load = 16 // (4 if dtype == "float32" else 8)
        assert found["fma"] == tiles.bk * tiles.tm * tiles.tn, name
        assert found["shared_loads_scalar"] == 0, name
        assert found["shared_loads_vector"] == tiles.bk * (tiles.tm + tiles.tn) // per_load, name
