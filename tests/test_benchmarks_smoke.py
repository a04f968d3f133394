"""The benchmarks run in --quick mode and end with the documented JSON line.

Timings and ratios are never asserted here: they belong to BENCHMARKS.md, and
a shared CI machine would make them flaky.
"""

from __future__ import annotations

import importlib
import json
import math
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"

CASES = {
    "fusion": (
        ["fusion.py"],
        ["fused_ms", "unfused_ms", "numpy_ms", "ratio_vs_unfused", "ratio_vs_numpy", "plan_calls", "threads"],
    ),
    "op_overhead": (
        ["op_overhead.py"],
        [
            "cellgraph_us",
            "cellgraph_run_us",
            "cellgraph_fused_us",
            "torch_us",
            "numpy_us",
            "ratio",
            "ratio_fused",
            "threads",
        ],
    ),
    "train_step_mlp": (
        ["train_step.py", "--model", "mlp"],
        ["cellgraph_sps", "torch_sps", "ratio", "peak_bytes", "live_bytes_lower_bound", "threads"],
    ),
    "train_step_cnn": (
        ["train_step.py", "--model", "cnn"],
        ["cellgraph_sps", "torch_sps", "ratio", "peak_bytes", "live_bytes_lower_bound", "threads"],
    ),
    # The deep models: the PyTorch twin starts from cellgraph's weights (the run stops unless the step-0 losses agree).
    "train_step_resnet": (
        ["train_step.py", "--model", "resnet", "--profile"],
        ["cellgraph_sps", "torch_sps", "ratio", "peak_bytes", "live_bytes_lower_bound", "first_loss_torch", "threads"],
    ),
    "train_step_transformer": (
        ["train_step.py", "--model", "transformer"],
        ["cellgraph_sps", "torch_sps", "ratio", "peak_bytes", "live_bytes_lower_bound", "first_loss_torch", "threads"],
    ),
    "train_step_resnet_large": (
        ["train_step.py", "--model", "resnet", "--large", "--training-constant"],
        ["cellgraph_sps", "torch_sps", "ratio", "peak_bytes", "live_bytes_lower_bound", "first_loss_torch", "threads"],
    ),
    "ps_throughput": (
        ["ps_throughput.py"],
        [
            "ps_gbps",
            "ps_pull_gbps",
            "ps_push_gbps",
            "tcp_gbps",
            "dask_gbps",
            "grpc_gbps",
            "ratio_vs_grpc",
            "cpu_s_per_gb_ratio_vs_grpc",
            "ratio_vs_tcp",
            "ratio_vs_dask",
            "two_shards_ratio_vs_grpc",
            "ratio_vs_grpc_prebuilt_push",
        ],  # fmt: skip
    ),
    "ps_latency": (
        ["ps_latency.py"],
        [
            "p50_ms",
            "p99_ms",
            "two_calls_p50_ms",
            "grpc_unary_p50_ms",
            "grpc_unary_p99_ms",
            "p50_ratio_vs_unary",
            "p99_ratio_vs_unary",
        ],
    ),
    # first_metrics_empty_cache_s is null in --quick (every kernel compiling takes about 80 s here).
    "scaling": (
        ["scaling.py"],
        [
            "sps_1",
            "sps_2",
            "efficiency_2",
            "first_metrics_s",
            "first_metrics_cold_s",
            "session_sps",
            "overhead_1",
            "cpu_efficiency_vs_local",
        ],  # fmt: skip
    ),
    "overlap_large": (["overlap_large.py"], ["model_mb", "overlap_fraction", "step_ms_overlap", "step_ms_no_overlap"]),
    # Root only (network namespaces); elsewhere it prints {"skipped": ...}, and the test is skipped with the reason.
    "netns_scaling": (["netns_scaling.py"], ["step_ms_overlap", "step_ms_no_overlap", "overlap_step_ratio"]),
    "ps_fanin": (["ps_fanin.py"], ["pushes_per_s_8", "pushes_per_s_256", "ratio", "pushes_8", "pushes_256"]),
    # max_steps_lost may be 0 (a kill just after a checkpoint), so it is not in the positive keys.
    "recovery": (["recovery.py"], ["max_recovery_s", "checkpoint_every", "steps"]),
    "scaling_model": (
        ["scaling_model.py"],
        [
            "efficiency_at_100",
            "efficiency_at_100_sigma_0_1",
            "efficiency_at_100_dedicated",
            "best_shards_at_100",
            "samples_per_s_at_100",
            "efficiency_at_100_fast_step",
        ],
    ),
    # cublas_tflops and matmul_ratio are null without CuPy, so only cellgraph's side is checked.
    "gpu_kernels": (
        ["gpu_kernels.py"],
        ["matmul_tflops", "fused_gb_per_s", "copy_gb_per_s", "fused_ratio"],
    ),
    # JupyterLab in Debian's Chromium; skipped, with the reason, where chromium is not installed.
    "graph_view": (["graph_view.py"], ["nodes", "first_paint_ms", "expand_ms"]),
    # max_abs_diff may be 0 (the mlp's ONNX Runtime output can match exactly), so it is not in the positive keys.
    "onnx_roundtrip": (
        ["onnx_roundtrip.py"],
        [
            "conformance_pass_rate",
            "conformance_min_op_pass_rate",
            "conformance_cases",
            "cellgraph_ms",
            "onnxruntime_ms",
        ],
    ),
    "train_return": (["train_return.py"], ["return_max_s", "target_return_s"]),
    # --quick runs `cellgraph demo --model mlp` twice (empty caches, then warm): cold_met is null then.
    "cold_start": (["cold_start.py"], ["cold_s", "warm_s", "target_cold_s", "target_warm_s"]),
}


# Benchmarks of one process on one thread run two at a time (two cores; their figures are not checked here): while
# a test waits for its own, the next ones start as a core frees. The others start clusters or servers and run alone.
ONE_CORE = [
    "fusion",
    "gpu_kernels",
    "onnx_roundtrip",
    "op_overhead",
    "scaling_model",
    "train_step_cnn",
    "train_step_mlp",
    "train_step_resnet",
    "train_step_resnet_large",
    "train_step_transformer",
]
ORDER = ONE_CORE + sorted(set(CASES) - set(ONE_CORE))
LANES = 2
RUN_TIMEOUT_S = 300


@dataclass
class _Started:
    proc: subprocess.Popen[str]
    out: IO[str]  # files, not pipes: a finished run waits for its test without blocking on a full pipe
    err: IO[str]


_started: dict[str, _Started] = {}
_finished: set[str] = set()


def _start(case: str) -> _Started:
    if case not in _started:
        script, *rest = CASES[case][0]
        out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
        proc = subprocess.Popen(
            [sys.executable, str(BENCHMARKS / script), *rest, "--quick"],
            stdout=out,
            stderr=err,
            text=True,
            cwd=BENCHMARKS.parent,
        )
        _started[case] = _Started(proc, out, err)
    return _started[case]


def _fill_lanes(after: str) -> None:
    """Start the one-core cases after ``after`` not started yet, while fewer than ``LANES`` of them run."""
    waiting = [c for c in ONE_CORE[ONE_CORE.index(after) + 1 :] if c not in _started and c not in _finished]
    while waiting and sum(1 for s in _started.values() if s.proc.poll() is None) < LANES:
        _start(waiting.pop(0))


@pytest.fixture(scope="module", autouse=True)
def _no_benchmark_left_running() -> Iterator[None]:
    """A benchmark started ahead for a test that was then not run (``-k``) is stopped with the module."""
    yield
    for started in _started.values():
        started.proc.kill()
        started.proc.wait()
    _started.clear()


def _run(case: str) -> subprocess.CompletedProcess[str]:
    """``case``'s benchmark run to its end in ``--quick`` mode."""
    started = _start(case)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    try:
        while started.proc.poll() is None:
            if case in ONE_CORE:
                _fill_lanes(case)
            if time.monotonic() > deadline:
                started.proc.kill()
                started.proc.wait()
                raise AssertionError(f"{case} ran past {RUN_TIMEOUT_S} s")
            time.sleep(0.05)
        if case in ONE_CORE:
            _fill_lanes(case)
    finally:
        _started.pop(case, None)
        _finished.add(case)
    started.out.seek(0)
    started.err.seek(0)
    return subprocess.CompletedProcess(
        started.proc.args, started.proc.returncode, started.out.read(), started.err.read()
    )


@pytest.mark.slow
@pytest.mark.parametrize("case", ORDER)
def test_quick_run_ends_with_json(case: str) -> None:
    argv, keys = CASES[case]
    script = argv[0]
    proc = _run(case)
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout}\n{proc.stderr}"
    lines = proc.stdout.strip().splitlines()
    assert lines, f"{script} printed nothing; stderr:\n{proc.stderr}"
    result = json.loads(lines[-1])
    if result.get("gpu", "") is None:  # gpu_kernels.py without a GPU (or on the simulator)
        assert result == {"gpu": None, "skipped": "no CUDA GPU"}
        assert "no CUDA GPU is present" in proc.stdout
        return
    if result.get("benchmark") == "netns_scaling" and "skipped" in result:
        pytest.skip(f"netns_scaling: {result['skipped']}")
    if result.get("browser_missing"):
        pytest.skip(result["skipped"])
    if result.get("torch_missing"):
        assert "pip install torch==" in proc.stdout
        pytest.skip(f"torch is not installed; {result['install']}")
    assert result["quick"] is True
    for key in keys:
        value = result[key]
        assert isinstance(value, (int, float)) and not isinstance(value, bool), f"{key} = {value!r}"
        assert math.isfinite(value) and value > 0, f"{key} = {value!r}"


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("", "the file is empty; save a benchmark's stdout in it"),
        ("not json\n", "its last line is not a benchmark's JSON line"),
    ],
)
def test_scaling_model_refuses_a_measured_file_that_is_no_benchmark_output(
    tmp_path: Path, content: str, words: str
) -> None:
    bad = tmp_path / "run.txt"
    bad.write_text(content)
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / "scaling_model.py"), "--quick", "--measured", str(bad)],
        capture_output=True, text=True, timeout=120, cwd=BENCHMARKS.parent,
    )  # fmt: skip
    assert proc.returncode != 0 and f"--measured {bad}: {words}" in proc.stderr


@pytest.mark.parametrize(
    ("flag", "words"),
    [
        ("--large", "--large is the resnet's compute-bound case; --model transformer has none"),
        (
            "--training-constant",
            "--training-constant is about batch norm's switch; --model transformer has no batch norm",
        ),
    ],
)
def test_train_step_refuses_a_resnet_flag_for_another_model(flag: str, words: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / "train_step.py"), "--model", "transformer", flag, "--quick"],
        capture_output=True, text=True, timeout=120, cwd=BENCHMARKS.parent,
    )  # fmt: skip
    assert proc.returncode != 0 and words in proc.stderr


def _benchmark_module(name: str) -> Any:
    """A module of benchmarks/ (they import each other by bare name, as when run as scripts)."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    return importlib.import_module(name)


def test_train_step_stops_when_the_step0_losses_differ(capsys: pytest.CaptureFixture[str]) -> None:
    train_step = _benchmark_module("train_step")
    assert train_step.check_step0("resnet", 2.5, 2.5 + 1e-6, same_start=True) == pytest.approx(1e-6)
    with pytest.raises(SystemExit, match=r"step-0 losses differ by 0\.1 > 0\.0001: the PyTorch resnet is not the same"):
        train_step.check_step0("resnet", 2.5, 2.6, same_start=True)
    with pytest.raises(SystemExit, match="differ by nan"):
        train_step.check_step0("transformer", float("nan"), 2.6, same_start=True)
    train_step.check_step0("mlp", 2.3, 2.4, same_start=False)  # each side's own weights: printed, not compared
    assert "each side's own initial weights: not compared" in capsys.readouterr().out


def test_train_step_weight_copy_refuses_a_shape_mismatch() -> None:
    torch = pytest.importorskip("torch")
    models = _benchmark_module("train_step_models")
    copies: list[Any] = []
    net = models.torch_transformer(torch, 32, 4, copies)
    values = {name: np.zeros(tuple(reversed(t.shape)) if layout == "dense" else tuple(t.shape), np.float32)
              for t, name, layout in copies}  # fmt: skip
    models.copy_weights(torch, copies, values)
    assert float(net.logits.weight.detach().abs().sum()) == 0.0  # the copy landed, transposed to PyTorch's layout
    values["logits/kernel"] = np.zeros((10, 32), np.float32)  # PyTorch's layout, not cellgraph's (in, out)
    with pytest.raises(
        SystemExit,
        match=r"weight copy: logits/kernel is \(10, 32\) in cellgraph, which does not fit torch's \(10, 32\) \(dense",
    ):
        models.copy_weights(torch, copies, values)
