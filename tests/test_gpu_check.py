"""benchmarks/gpu_check.py, the device check of issue 19, works before device time is spent on it.

The end-to-end test runs the whole check on Numba's simulator (``--simulate``:
tiny shapes) in a subprocess and reads back every JSON file it writes; the
others check its parts without running a kernel.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
sys.path.insert(0, str(SCRIPT.parent))
import gpu_check  # noqa: E402


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.slow
def test_the_whole_check_runs_on_the_simulator(tmp_path: Path) -> None:
    proc = _run("run", "--out", str(tmp_path), "--simulate", timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    written = {p.name for p in tmp_path.iterdir()}
    assert written == {f"{s}.json" for s in ("install", "gpu_kernels", "train", "cuda_tests", "summary")} | {
        "cuda_tests.log"
    }
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["simulated"] is True
    steps = summary["steps"]
    assert steps["install"]["status"].startswith("skipped: the simulator runs on the machine")

    kernels = steps["gpu_kernels"]
    assert kernels["status"] == "ok", kernels
    assert kernels["simulated"] is True and kernels["gpu"] == "Numba's CUDA simulator"
    assert kernels["matmul_tflops"] > 0 and kernels["copy_gb_per_s"] > 0 and kernels["fused_gb_per_s"] > 0
    assert kernels["cublas_tflops"] is None and kernels["cublas_skipped"] == "the simulator has no cuBLAS"
    from cellgraph.dataflow.kernels.cuda import gemm

    assert len(kernels["matmul_tiles"]) == len(gemm.TIMED) and all(v > 0 for v in kernels["matmul_tiles"].values())

    train = steps["train"]
    assert train["status"] == "ok", train
    cpu, gpu, cluster_cpu, cluster_gpu = train["runs"]
    assert (cpu["device"], gpu["device"]) == ("cpu", "gpu") and cpu["model"] == gpu["model"] == "mlp"
    assert gpu["ops_on_gpu"] == gpu["ops"] > 0 and cpu["ops_on_gpu"] == 0
    assert gpu["steps"] == cpu["steps"] == 1
    # The same steps on the same data: the GPU kernels train the model the CPU kernels train.
    assert gpu["final_loss"] == pytest.approx(cpu["final_loss"], rel=1e-4)
    # And a cg.train job whose replica computes on its worker's (simulated) GPU trains what the CPU replica does.
    assert cluster_cpu["cluster"] is cluster_gpu["cluster"] is True and cluster_gpu["status"] == "ok"
    assert cluster_gpu["ops_on_gpu"] > 0 == cluster_cpu["ops_on_gpu"] and cluster_gpu["steps"] == 1
    assert cluster_gpu["final_loss"] == pytest.approx(cluster_cpu["final_loss"], rel=1e-4)
    assert train["accuracy_gpu_minus_cpu"] == {
        "mlp": pytest.approx(0.0, abs=1e-9),
        "cluster/mlp": pytest.approx(0.0, abs=1e-9),
    }

    tests = steps["cuda_tests"]
    assert tests["status"] == "ok" and tests["passed"] == 1, tests
    assert tests["files"] == [gpu_check.SIMULATED_TEST]
    assert "1 passed" in (tmp_path / "cuda_tests.log").read_text()
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {s: steps[s]["status"] for s in steps}


def test_steps_past_the_budget_are_recorded_as_not_run(tmp_path: Path) -> None:
    summary = gpu_check.run_check(tmp_path, simulate=True, budget_s=0, wheels=None, tests=None)
    statuses = {step: result["status"] for step, result in summary["steps"].items()}
    spent = "not run: the budget (--budget-s) was spent"
    assert statuses["gpu_kernels"] == statuses["cuda_tests"] == spent
    assert summary["steps"]["train"]["runs"] == [{"status": spent}] * 4  # in one process and on a cluster, CPU and GPU
    assert json.loads((tmp_path / "cuda_tests.json").read_text())["status"] == spent


def test_only_runs_the_named_steps_and_refuses_unknown_ones(tmp_path: Path) -> None:
    summary = gpu_check.run_check(tmp_path, simulate=True, budget_s=0, wheels=None, tests=None, only=("train",))
    assert set(summary["steps"]) == {"install", "train"}
    proc = _run("run", "--out", str(tmp_path), "--simulate", "--only", "train,benchmark")
    assert proc.returncode == 2
    assert "--only: unknown step(s) benchmark; the steps are gpu_kernels, train, cuda_tests" in proc.stderr


def test_the_cuda_tests_are_found_by_their_mark() -> None:
    files = gpu_check.cuda_test_files()
    assert {"tests/dataflow/test_cuda_matmul.py", "tests/dataflow/test_op_table.py"} <= set(files)
    assert "tests/test_gpu_check.py" not in files and "tests/dataflow/test_graph.py" not in files


def test_pytest_counts_read_the_summary_line() -> None:
    done = subprocess.CompletedProcess(["pytest"], 1, "x\n3 failed, 40 passed, 2 skipped in 9.1s\n", "")
    counts = gpu_check.pytest_counts(done, ["a.py"])
    assert counts["status"] == "failed (exit 1)"
    assert (counts["passed"], counts["failed"], counts["skipped"]) == (40, 3, 2)
    clean = gpu_check.pytest_counts(subprocess.CompletedProcess([], 0, "41 passed in 9.1s\n", ""), [])
    assert clean["status"] == "ok"
    skipped = gpu_check.pytest_counts(subprocess.CompletedProcess([], 0, "40 passed, 1 skipped in 9s\n", ""), [])
    assert skipped["status"] == "failed: 1 skipped"  # a cuda test skipped on a GPU did not check anything
    none = gpu_check.pytest_counts(subprocess.CompletedProcess([], 0, "3 deselected in 1s\n", ""), [])
    assert none["status"] == "failed: no test passed"


def test_the_wheels_carry_what_the_device_image_lacks() -> None:
    closure = gpu_check.requirement_closure()
    assert {"dask", "distributed", "grpcio", "ipywidgets", "anywidget"} <= set(closure)  # dask[distributed] too
    assert {"numba", "numba-cuda"} <= gpu_check.IN_IMAGE & set(closure)
    assert "numpy" in closure and "numpy" not in gpu_check.IN_IMAGE  # the image's NumPy 2.5 breaks numba-cuda


def test_a_broken_wheel_stops_the_check_at_install(tmp_path: Path) -> None:
    # pip refuses the file before it installs anything: nothing else runs without cellgraph installed.
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "broken-1.0-py3-none-any.whl").write_bytes(b"not a zip archive")
    summary = gpu_check.run_check(tmp_path / "out", simulate=False, budget_s=120, wheels=wheels, tests=None)
    assert list(summary["steps"]) == ["install"]
    install = json.loads((tmp_path / "out" / "install.json").read_text())
    assert install["status"] == "failed: the carried wheels (failed (exit 1))", install
    assert "broken-1.0-py3-none-any.whl" in install["tail"]
