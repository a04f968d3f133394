"""Issue 19's device check: everything the GPU path must show, in one run, as JSON files under ``--out``.

The device machines have no package index. Prepare the wheels of what their
CUDA image lacks here, then run the check there (the ``device`` tool's
``run``, with ``.whl`` carried), or run it anywhere on Numba's simulator:

    python benchmarks/gpu_check.py wheels --dest .whl         # here: needs the package index
    python3 benchmarks/gpu_check.py run --out "$OUT" --wheels .whl --budget-s 540
    python benchmarks/gpu_check.py run --out DIR --simulate  # tiny shapes; tests/test_gpu_check.py

The wheels (about 33 MB, 61 files) travel with the working tree, so keep
them out of git (``echo /.whl/ >> .git/info/exclude``). ``run`` does these
steps in order, each in its own process with its own
deadline, each writing its JSON as soon as it ends, so a run cut short still
returns what it measured; a step that no longer fits in ``--budget-s`` is
recorded as not run, with that reason:

1. ``install.json``: the carried wheels into ``/tmp/cellgraph-site`` (on
   ``PYTHONPATH`` for every later step), cellgraph installed editable, and
   the versions of Numba, numba-cuda and CuPy that the steps then import.
2. ``gpu_kernels.json``: ``benchmarks/gpu_kernels.py`` (matmul 4096x4096
   float32 against cuBLAS through CuPy in the same run, each GEMM tile
   shape, the fused 8-op chain against device copy bandwidth).
3. ``train.json``: the MLP and the mini-Inception trained on the digits,
   once on the CPU (``Session``) and once with every op that has a CUDA
   kernel on the GPU (``PartitionedSession``), same data, order and seed:
   test accuracy, final loss and samples per second of each; then each as a
   ``cg.train`` job on a LocalCluster (one PS, one training worker) whose
   replica computes on the worker's CPU, then on its GPU (``gpu=True``). It
   runs beside step 4, so its speeds are not clean figures; its accuracies are.
4. ``cuda_tests.json`` (and ``cuda_tests.log``): ``pytest -m cuda`` over the
   test files that hold cuda-marked tests, on the GPU: in parallel processes
   (pytest-xdist) with a deadline per test (pytest-timeout) where the image
   has those plugins, since compiling the kernels is what takes the time.

``summary.json`` gathers every figure and each step's status. ``--simulate``
sets ``NUMBA_ENABLE_CUDASIM=1`` for every step, installs nothing, and shrinks
each step (tiny benchmark shapes, two training steps on a few samples, one
selected test; the MLP alone, since one mini-Inception step takes minutes
there, where ``tests/dataflow/test_partition.py`` trains it on a GPU device in
the simulator column): it proves the script runs end to end, it measures
nothing. ``--only`` runs some of steps 2-4 (install always runs), so the
check can be split over two device commands of 10 minutes each.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SITE = "/tmp/cellgraph-site"  # where the carried wheels go: a fresh machine, nothing of the image replaced
WORKER_CPU = "/job:worker/task:0/device:cpu:0"
GPU = "/job:worker/task:0/device:gpu:0"
# What the device machines' CUDA image already holds, large or tied to its CUDA: never carried. NumPy is
# carried: the image's 2.5 removed np.row_stack, which its numba-cuda 0.30.4 still registers when it compiles
# its first kernel (AttributeError, in every kernel; seen 2026-12-04), so pyproject.toml caps NumPy below 2.5.
IN_IMAGE = {
    "scipy", "numba", "llvmlite", "numba-cuda", "cuda-bindings", "cuda-core", "cuda-pathfinder",
    "cuda-python", "cuda-toolkit", "pandas", "scikit-learn", "joblib", "threadpoolctl", "pip", "setuptools",
    "pytest", "pluggy", "iniconfig", "hypothesis", "tqdm",
}  # fmt: skip
WHEEL_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
# Step deadlines (seconds) on a GPU; each is also cut to what is left of --budget-s.
STEP_S = {"install": 120, "gpu_kernels": 180, "train": 300, "cuda_tests": 420}
# pytest processes for the cuda tests on a GPU (pytest-xdist, in the device image): Numba compiles each kernel
# on the CPU, and the compiles, not the GPU, are what take the time. Each test has a deadline (pytest-timeout).
TEST_WORKERS = 8
TEST_TIMEOUT_S = 120
SIMULATED_TEST = "tests/dataflow/test_cuda_matmul.py::test_matmul_of_empty_operands"


# ------------------------------------------------------------------ wheels (here)
def requirement_closure(top: str = "cellgraph") -> dict[str, str]:
    """{distribution: installed version} of everything ``top`` needs, extras it asks for included."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    found: dict[str, str] = {}
    todo: list[tuple[str, frozenset[str]]] = [(top, frozenset())]
    while todo:
        name, extras = todo.pop()
        dist = metadata.distribution(name)
        found[canonicalize_name(name)] = dist.version
        for line in dist.requires or []:
            req = Requirement(line)
            wanted = req.marker is None or any(req.marker.evaluate({"extra": e}) for e in extras or {""})
            if wanted and canonicalize_name(req.name) not in found:
                todo.append((req.name, frozenset(req.extras)))
    return found


def download_wheels(dest: Path) -> list[str]:
    """Wheels (CPython 3.12, x86-64 Linux) of cellgraph's dependencies the device image lacks, into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    wanted = sorted(f"{n}=={v}" for n, v in requirement_closure().items() if n not in IN_IMAGE and n != "cellgraph")
    platforms = [arg for p in WHEEL_PLATFORMS for arg in ("--platform", p)]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12"]
    cmd += ["--implementation", "cp", *platforms, "-d", str(dest), *wanted]
    subprocess.run(cmd, check=True, timeout=600)
    return wanted


# ------------------------------------------------------------------- train (one model, one device)
def model_and_digits(model: str, limit: int | None) -> tuple[Any, tuple[Any, Any], tuple[Any, Any]]:
    """``model`` built afresh, and the digits' (x, y) training and test splits for it (the first ``limit`` rows)."""
    from cellgraph.examples import digits, models

    m = models.MODELS[model]()
    data = digits.load()
    x_train = data.images(data.x_train) if m.image_input else data.x_train
    x_test = data.images(data.x_test) if m.image_input else data.x_test
    y_train, y_test = data.y_train, data.y_test
    if limit is not None:
        x_train, y_train, x_test, y_test = x_train[:limit], y_train[:limit], x_test[:limit], y_test[:limit]
    return m, (x_train, y_train), (x_test, y_test)


def train(model: str, device: str, epochs: int, batch: int, limit: int | None) -> dict[str, Any]:
    """Train ``model`` on the digits on ``device`` (cpu or gpu); its accuracy, loss and speed."""
    import numpy as np

    import cellgraph as cg

    m, (x_train, y_train), (x_test, y_test) = model_and_digits(model, limit)
    on_gpu = 0
    if device == "gpu":
        placement = cg.placement.place(m.graph, [WORKER_CPU, GPU])
        on_gpu = sum(1 for d in placement.device_of.values() if d == GPU)
        sess: Any = cg.PartitionedSession(m.graph, placement, timeout=600)
    else:
        sess = cg.Session(m.graph)
    rng = np.random.default_rng(0)
    started = time.perf_counter()
    steps, loss, first_step_s = 0, float("nan"), None
    for _ in range(epochs):
        order = rng.permutation(len(x_train))
        for i in range(0, len(x_train) - batch + 1, batch):
            idx = order[i : i + batch]
            loss = float(sess.run([m.train_op, m.loss], {m.x: x_train[idx], m.y: y_train[idx]})[1])
            steps += 1
            if first_step_s is None:  # JIT compilation of every kernel the step runs
                first_step_s, started = time.perf_counter() - started, time.perf_counter()
    seconds = time.perf_counter() - started
    accuracy = float(sess.run(m.accuracy, {m.x: x_test, m.y: y_test}))
    return {
        "model": model,
        "device": device,
        "ops_on_gpu": on_gpu,
        "ops": len(m.graph.nodes),
        "epochs": epochs,
        "batch": batch,
        "steps": steps,
        "final_loss": loss,
        "test_accuracy": accuracy,
        "first_step_s": first_step_s,
        "samples_per_s": (steps - 1) * batch / seconds if steps > 1 and seconds > 0 else None,
    }


def cluster_train(model: str, device: str, epochs: int, batch: int, limit: int | None) -> dict[str, Any]:
    """Train ``model`` with ``cg.train`` on a LocalCluster (one PS, one training worker), its replica on the
    worker's ``device`` (``gpu=True`` or ``False``); the test accuracy of the trained variables."""
    import numpy as np

    import cellgraph as cg

    m, (x_train, y_train), (x_test, y_test) = model_and_digits(model, limit)
    steps = max(1, epochs * (len(x_train) // batch))
    with cg.Cluster.local(workers=1, ps=1, timeout=120) as cluster:
        started = time.perf_counter()
        job = cg.train(
            m.loss, (x_train, y_train), cluster=cluster, optimizer=cg.optim.SGD(0.1), replicas=1, batch_size=batch,
            steps=steps, checkpoint_every=None, gpu=device == "gpu", seed=0, timeout_s=600,
        )  # fmt: skip
        try:
            job.wait(STEP_S["train"])
            seconds = time.perf_counter() - started
            accuracy = float(job.evaluate(m.accuracy, m.eval_feeds(x_test, y_test)))
            on_gpu = sum(1 for d in job.placement.device_of.values() if d == GPU)
            final_loss = float(job.metrics[-1]["loss"]) if job.metrics else float(np.nan)
        finally:
            job.close()
    return {
        "model": model,
        "device": device,
        "cluster": True,
        "ops_on_gpu": on_gpu,
        "steps": steps,
        "batch": batch,
        "final_loss": final_loss,
        "test_accuracy": accuracy,
        "seconds": seconds,
    }


# ----------------------------------------------------------------- run (the device check)
class Steps:
    """Runs the check's steps as subprocesses under one budget, writing each step's JSON under ``out``."""

    def __init__(self, out: Path, simulate: bool, budget_s: float) -> None:
        self.out, self.simulate = out, simulate
        self.deadline = time.monotonic() + budget_s
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if simulate:
            self.env["NUMBA_ENABLE_CUDASIM"] = "1"
        self.summary: dict[str, Any] = {"simulated": simulate, "budget_s": budget_s, "steps": {}}
        self.lock = threading.Lock()  # the training runs beside the cuda tests: both record

    def time_for(self, step: str) -> float | None:
        """Seconds ``step`` may take: its own deadline, cut to what is left of the budget; None if under 10 s."""
        left = self.deadline - time.monotonic()
        return min(STEP_S[step], left) if left >= 10 else None

    def call(
        self, step: str, cmd: list[str], log: Path | None = None, limit_s: float | None = None
    ) -> subprocess.CompletedProcess[str] | str:
        """The finished process, or why it did not finish (out of budget, past its deadline: ``limit_s``, or
        the step's own). A process past its deadline is killed with every process it started (a LocalCluster's
        workers, which would outlive it): it runs in a session of its own."""
        limit = self.time_for(step)
        if limit is None:
            return "not run: the budget (--budget-s) was spent"
        limit = min(limit, limit_s) if limit_s is not None else limit
        child = subprocess.Popen(
            cmd, cwd=ROOT, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True,
        )  # fmt: skip
        try:
            stdout, stderr = child.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            stdout, _ = child.communicate()
            if log is not None:
                log.write_text(stdout or "")
            return f"not finished: past its {limit:.0f} s deadline"
        if log is not None:
            log.write_text(stdout + stderr)
        return subprocess.CompletedProcess(cmd, child.returncode, stdout, stderr)

    def record(self, step: str, result: dict[str, Any]) -> None:
        with self.lock:
            self.summary["steps"][step] = result
            (self.out / f"{step}.json").write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
            (self.out / "summary.json").write_text(json.dumps(self.summary, indent=1, sort_keys=True) + "\n")
        print(f"[gpu_check] {step}: {result.get('status')}", flush=True)


def _last_json(proc: subprocess.CompletedProcess[str] | str) -> dict[str, Any]:
    """The JSON object a step printed last, with its status; or the reason it has none."""
    if isinstance(proc, str):
        return {"status": proc}
    lines = proc.stdout.strip().splitlines()
    try:
        result = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        result = None
    if proc.returncode != 0 or not isinstance(result, dict):
        return {"status": f"failed (exit {proc.returncode})", "tail": (proc.stdout + proc.stderr)[-3000:]}
    return {"status": "ok", **result}


def install(steps: Steps, wheels: Path | None) -> None:
    if steps.simulate:
        steps.record("install", {"status": "skipped: the simulator runs on the machine that is already set up"})
        return
    done: list[str] = []
    if wheels is not None and any(wheels.glob("*.whl")):
        pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--upgrade"]
        proc = steps.call("install", [*pip, "--target", SITE, *map(str, sorted(wheels.glob("*.whl")))])
        if isinstance(proc, str) or proc.returncode != 0:
            steps.record(
                "install", {**_last_json(proc), "status": f"failed: the carried wheels ({_last_json(proc)['status']})"}
            )
            return
        done.append(f"{len(list(wheels.glob('*.whl')))} wheels into {SITE}")
        steps.env["PYTHONPATH"] = os.pathsep.join(filter(None, [SITE, steps.env.get("PYTHONPATH")]))
    editable = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-index",
        "--no-deps",
        "--no-build-isolation",
        "-e",
        ".",
    ]
    proc = steps.call("install", editable)
    if isinstance(proc, str) or proc.returncode != 0:
        steps.record(
            "install", {**_last_json(proc), "status": f"failed: pip install -e . ({_last_json(proc)['status']})"}
        )
        return
    probe = (
        "import json, numpy, numba, numba.cuda, cellgraph\n"
        "v = {'numpy': numpy.__version__, 'numba': numba.__version__, 'gpu': numba.cuda.is_available()}\n"
        "try:\n import cupy; v['cupy'] = cupy.__version__\nexcept ImportError: v['cupy'] = None\nprint(json.dumps(v))"
    )
    versions = _last_json(steps.call("install", [sys.executable, "-c", probe]))
    steps.record("install", {**versions, "done": done + ["cellgraph editable"]})


STEPS = ("gpu_kernels", "train", "cuda_tests")


def run_check(
    out: Path, simulate: bool, budget_s: float, wheels: Path | None, tests: str | None, only: tuple[str, ...] = STEPS
) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    steps = Steps(out, simulate, budget_s)
    install(steps, wheels)
    if not steps.summary["steps"]["install"]["status"].startswith(("ok", "skipped")):
        return steps.summary  # nothing else can run without cellgraph

    if "gpu_kernels" in only:
        bench = [sys.executable, "benchmarks/gpu_kernels.py", "--simulate" if simulate else "--quick"]
        steps.record("gpu_kernels", _last_json(steps.call("gpu_kernels", bench)))
    # The training runs beside the cuda tests (their timings are not targets; the kernels' above ran alone).
    training = threading.Thread(target=train_all, args=(steps,)) if "train" in only else None
    if training is not None:
        training.start()
    if "cuda_tests" in only:
        files = [tests] if tests else cuda_test_files()
        cmd = [sys.executable, "-m", "pytest", "-m", "cuda", "-rfEs", "--tb=short", "-p", "no:cacheprovider"]
        proc = steps.call("cuda_tests", [*cmd, *pytest_speedups(simulate), *files], out / "cuda_tests.log")
        steps.record("cuda_tests", pytest_counts(proc, files))
    if training is not None:
        training.join()
    return steps.summary


def pytest_speedups(simulate: bool) -> list[str]:
    """On a GPU: parallel test processes and a deadline per test, where the image has the plugins for them."""
    if simulate:
        return ["-q"]
    args = ["-v"]  # one line per test: a run cut short still says which passed
    if importlib.util.find_spec("xdist") is not None:
        args += ["-n", str(min(TEST_WORKERS, os.cpu_count() or 1))]
    if importlib.util.find_spec("pytest_timeout") is not None:
        args += [f"--timeout={TEST_TIMEOUT_S}"]
    return args


def train_all(steps: Steps) -> None:
    """Each model on the CPU, then on the GPU: same data, order and seed."""
    epochs, batch, limit = (1, 4, 4) if steps.simulate else (3, 64, None)  # simulated: one step (16 s of the simulator)
    models = ("mlp",) if steps.simulate else ("mlp", "inception")

    def group(where: str) -> list[dict[str, Any]]:
        found = []
        for model in models:
            for device in ("cpu", "gpu"):
                cmd = [sys.executable, __file__, "train", "--model", model, "--device", device, "--epochs", str(epochs)]
                cmd += ["--batch", str(batch)] + (["--limit", str(limit)] if limit else []) + ([where] if where else [])
                found.append(
                    _simulated_retry(steps, cmd) if steps.simulate and where else _last_json(steps.call("train", cmd))
                )
        return found

    # In one process (Session, PartitionedSession), and beside it as cg.train jobs on a LocalCluster whose replica
    # computes on its worker's CPU, then on its GPU.
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        groups = list(pool.map(group, ("", "--cluster")))
    runs = [run for found in groups for run in found]
    by = {(("cluster/" if r.get("cluster") else "") + str(r.get("model")), r.get("device")): r for r in runs}
    gaps = {
        model: by[(model, "gpu")]["test_accuracy"] - by[(model, "cpu")]["test_accuracy"]
        for model in sorted({model for model, _ in by})
        if (model, "gpu") in by and (model, "cpu") in by
    }
    ok = all(r["status"] == "ok" for r in runs)
    steps.record("train", {"status": "ok" if ok else "failed", "runs": runs, "accuracy_gpu_minus_cpu": gaps})


# A simulated cluster job takes 3-60 s. Numba's simulator runs a thread per CUDA thread, and a worker process
# of such a job was once found with its kernel launch stuck creating the next of a block's 256 threads (in
# pthread_create, 247 started; twice in a row on 2026-12-04, then not in seven runs): on the simulator only,
# a run that does not finish in half the step's time is killed and run once more, and its JSON says so.
SIMULATED_CLUSTER_ATTEMPT_S = STEP_S["train"] / 2


def _simulated_retry(steps: Steps, cmd: list[str]) -> dict[str, Any]:
    first = _last_json(steps.call("train", cmd, limit_s=SIMULATED_CLUSTER_ATTEMPT_S))
    if first["status"] != f"not finished: past its {SIMULATED_CLUSTER_ATTEMPT_S:.0f} s deadline":
        return first
    second = _last_json(steps.call("train", cmd, limit_s=SIMULATED_CLUSTER_ATTEMPT_S))
    return {**second, "first_attempt": first["status"]}


def cuda_test_files() -> list[str]:
    """The test files that hold cuda-marked tests (collecting the rest needs packages a GPU run does not)."""
    marked = re.compile(r"pytest\.mark\.cuda\b")
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py") if marked.search(p.read_text()))


def pytest_counts(proc: subprocess.CompletedProcess[str] | str, files: list[str]) -> dict[str, Any]:
    if isinstance(proc, str):
        return {"status": proc, "files": files}
    lines = proc.stdout.strip().splitlines()
    summary = lines[-1] if lines else ""
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", summary)}
    if proc.returncode != 0:
        status = f"failed (exit {proc.returncode})"
    elif counts.get("skipped"):  # a cuda test skipped on a GPU checked nothing
        status = f"failed: {counts['skipped']} skipped"
    elif not counts.get("passed"):
        status = "failed: no test passed"
    else:
        status = "ok"
    return {"status": status, "summary": summary, **counts, "files": files}


# ----------------------------------------------------------------------------------- command line
def main(argv: list[str] | None = None) -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = cli.add_subparsers(dest="command", required=True)
    w = sub.add_parser("wheels", help="download the wheels the device image lacks (needs the package index)")
    w.add_argument("--dest", type=Path, default=ROOT / ".whl")
    r = sub.add_parser("run", help="the device check; every figure as JSON under --out")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--simulate", action="store_true", help="Numba's CUDA simulator, tiny shapes: checks the script")
    r.add_argument("--budget-s", type=float, default=540.0, help="stop starting steps after this many seconds")
    r.add_argument("--wheels", type=Path, help="a folder of wheels to install first (see the wheels command)")
    r.add_argument("--tests", help="one pytest path or node id instead of every cuda-marked file")
    r.add_argument("--only", default=",".join(STEPS), help=f"comma-separated steps among {', '.join(STEPS)}")
    t = sub.add_parser("train", help="train one model on one device; prints one JSON line")
    t.add_argument("--model", choices=["mlp", "inception"], required=True)
    t.add_argument("--device", choices=["cpu", "gpu"], required=True)
    t.add_argument("--epochs", type=int, default=3)
    t.add_argument("--batch", type=int, default=64)
    t.add_argument("--limit", type=int, help="train and test on the first LIMIT samples of each split")
    t.add_argument("--cluster", action="store_true", help="as a cg.train job on a LocalCluster (one PS, one worker)")
    args = cli.parse_args(argv)
    if args.command == "wheels":
        print("\n".join(download_wheels(args.dest)))
    elif args.command == "train":
        trainer = cluster_train if args.cluster else train
        print(json.dumps(trainer(args.model, args.device, args.epochs, args.batch, args.limit)))
    else:
        tests = args.tests or (SIMULATED_TEST if args.simulate else None)
        only = tuple(args.only.split(","))
        unknown = sorted(set(only) - set(STEPS))
        if unknown:
            cli.error(f"--only: unknown step(s) {', '.join(unknown)}; the steps are {', '.join(STEPS)}")
        summary = run_check(args.out, args.simulate, args.budget_s, args.wheels, tests, only)
        print(json.dumps({step: result["status"] for step, result in summary["steps"].items()}))


if __name__ == "__main__":
    main()
