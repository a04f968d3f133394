"""Distributed training throughput: the mini-Inception with 1 and 2 sync replicas on a LocalCluster (1 PS).

Each replica trains on batches of ``--batch`` digits (default 64), so a global
step of the 2-replica job processes twice the samples of the 1-replica job's.
Both jobs run on the same ``cg.Cluster.local(workers=2, ps=1)`` (a 1-replica
job uses one training worker), ``mode="sync"``, ``cg.optim.SGD(0.1)``; the
rounds alternate which job goes first, so a slow spell of the shared machine
hits both alike.

    python benchmarks/scaling.py [--quick] [--threads N] [--batch B]

What is measured:

- ``sps_1``, ``sps_2``: samples per second of the whole job in steady state,
  from the global-step timestamps of replica 0's metrics events: (global
  steps x replicas x batch) / seconds, between the first event after the
  warm-up (the first ``WARMUP_S`` of training: the first steps, any late
  compile) and the last event before the end. The median over the rounds.
  ``efficiency_2`` = sps_2 / (2 x sps_1); target >= 0.85.
- ``cpu_efficiency_vs_local``: samples per CPU-second of every cluster
  process (scheduler, client, workers, servers), ``cg.train`` to the job's
  end, over ``session_sps`` (below) of one process; target >= 0.75.
  ``cpu_efficiency_vs_local_steady``: the same once training runs, from the
  end of the warm-up to 90% of the job's steps (reported, no target).
- ``first_metrics_s``: seconds from ``cg.train`` returning to the first
  metrics event, on a cluster whose workers have already run the model
  (their kernels are compiled, in memory); the median over the measured
  jobs. Target <= 3 s.
- ``first_metrics_cold_s``: the same for a fresh cluster's first job (new
  worker and PS processes), with the on-disk kernel caches as found (after
  any earlier run, warm: kernels load from disk rather than compile).
  ``first_metrics_empty_cache_s``: a fresh cluster's first job with empty
  caches, ``NUMBA_CACHE_DIR`` and ``CELLGRAPH_CACHE_DIR`` pointed at a new
  temporary folder in the worker processes' environment, so every kernel
  compiles (full runs, or ``--empty-cache``; about 80 s here, too long for
  ``--quick``).
- ``session_sps``: single-process training of the same model and batch
  (``Session.make_callable([train_op, loss])``, as ``train_step.py``);
  ``replica_compute_sps``: the replica's own computation (loss and
  gradients from fed variables, ``training_graph.load(...).compute``) in
  this process. ``overhead_1`` = session_sps / sps_1: what the parameter
  round trip, the sync wait and the cluster's other processes cost one
  replica.

Each job runs a fixed number of global steps, sized from the previous job
to last about ``--seconds``, and ends on its own, so that every job does the
same work whatever the machine's speed and no stop falls inside a measured
interval.

The last line of stdout is one JSON object.
"""

from __future__ import annotations

import math
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from _common import emit, machine, parser, setup_threads, source, thread_pools, time_interleaved, versions
from ps_throughput import _descendants, cpu_s

LEARNING_RATE = 0.1
TARGET_EFFICIENCY = 0.85
TARGET_FIRST_METRICS_S = 3.0
WARMUP_S = 1.0  # training seconds left out of the steady state (first steps, a late compile)
TARGET_CPU_EFFICIENCY = 0.75  # issue 15
TARGET_OVERLAP = 0.6  # issue 15
FIRST_JOB_STEPS = 20  # the first job on a fresh cluster: its first metrics event is what is timed
LONGER_TRIES = 2  # a job too short to measure runs again with 4x the steps, at most this many times
JOB_TIMEOUT_S = 180.0  # deadline of every wait on a job (the cold first job compiles every kernel)
POLL_S = 0.002
STEADY_POLL_S = 0.1  # polling the global step costs the client CPU that the figure counts: not too often


@dataclass
class JobRun:
    """What one measured job gave: its replicas, the time to its first metrics event, its throughput."""

    replicas: int
    train_call_s: float  # cg.train itself: checks, PS start, scatter, submit
    first_metrics_s: float
    sps: float  # steady state, whole job
    window_sps: list[float]  # the same per metrics interval (noise within the job)
    step_time_ms: float  # median of the replicas' reported mean step times, steady state
    global_steps: int
    samples_per_cpu_s: float = 0.0  # samples trained / CPU-s of every cluster process, cg.train to the end
    # The same between the end of the warm-up and 90% of the job's steps: what a sample costs once it trains,
    # without the job's start (shipping the graph, starting the servers, loading the kernels); None if too short.
    samples_per_cpu_s_steady: float | None = None
    overlap: float = 0.0  # mean overlap_fraction of the steady-state metrics
    # Spread of the replicas' step times: the standard deviation of log(step time) over the steady-state metrics
    # windows (each a mean over its window's steps, so a lower bound of the per-step jitter).
    jitter_sigma: float = 0.0


@contextmanager
def environment(**values: str) -> Iterator[None]:
    """Set environment variables (inherited by processes spawned meanwhile); restore them after."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


def steady_state(
    metrics: list[dict[str, Any]], replicas: int, batch: int, warmup_s: float
) -> tuple[float, list[float]]:
    """(samples/s of the job, samples/s per metrics window) from replica 0's events after ``warmup_s``."""
    events = sorted((m for m in metrics if m["replica"] == 0 and not m["final"]), key=lambda m: m["time"])
    if not events:
        raise RuntimeError("the job sent no metrics event from replica 0")
    start = events[0]["time"] + warmup_s
    kept = [m for m in events if m["time"] >= start]
    if len(kept) < 3:
        raise RuntimeError(
            f"only {len(kept)} metrics event(s) after the {warmup_s:g} s warm-up: run the jobs longer (--seconds)"
        )
    per_step = replicas * batch  # sync: every global step averages one batch from each replica

    def rate(a: dict[str, Any], b: dict[str, Any]) -> float:
        return (b["step"] - a["step"]) * per_step / (b["time"] - a["time"])

    return rate(kept[0], kept[-1]), [rate(a, b) for a, b in zip(kept, kept[1:])]


def run_job(cg: Any, cluster: Any, model: Any, data: tuple[Any, Any], replicas: int, steps: int, args: Any) -> JobRun:
    """Train ``steps`` global steps to the end (the job is not stopped early: see the module's notes), measure it."""
    began = time.perf_counter()
    cpu_before = cpu_s(_descendants(os.getpid()))
    job = cg.train(
        model.loss, data, cluster=cluster, optimizer=cg.optim.SGD(LEARNING_RATE), replicas=replicas,
        batch_size=args.batch, steps=steps, mode="sync", checkpoint_every=None,
        metrics_interval_s=args.interval, timeout_s=JOB_TIMEOUT_S,
    )  # fmt: skip
    try:
        returned = time.perf_counter()
        while not job.metrics:
            if job.status == "failed" or time.perf_counter() - returned > JOB_TIMEOUT_S:
                job.wait(0)  # raises the replica's error, or says the job is still running
                raise RuntimeError(f"no metrics within {JOB_TIMEOUT_S:g} s of cg.train; events: {job.events}")
            time.sleep(POLL_S)
        first = time.perf_counter() - returned
        steady_cpu = steady_samples_per_cpu_s(job, replicas, steps, args.batch)
        job.wait(JOB_TIMEOUT_S)
        cpu_used = cpu_s(_descendants(os.getpid())) - cpu_before
        metrics = list(job.metrics)
        global_steps = job.global_step()
    finally:
        job.close()
    t0 = min(m["time"] for m in metrics)
    steady = [m for m in metrics if m["time"] >= t0 + WARMUP_S and not m["final"]]
    try:
        sps, windows = steady_state(metrics, replicas, args.batch, WARMUP_S)
    except RuntimeError:  # too short to measure: the caller runs it again, longer
        sps, windows = 0.0, []
    return JobRun(
        replicas=replicas,
        train_call_s=returned - began,
        first_metrics_s=first,
        sps=sps,
        window_sps=windows,
        step_time_ms=statistics.median(m["step_time_s"] for m in steady) * 1e3 if steady else float("nan"),
        global_steps=global_steps,
        samples_per_cpu_s=global_steps * replicas * args.batch / max(cpu_used, 1e-9),
        samples_per_cpu_s_steady=steady_cpu,
        overlap=statistics.fmean(m.get("overlap_fraction", 0.0) for m in steady) if steady else 0.0,
        jitter_sigma=statistics.pstdev(math.log(m["step_time_s"]) for m in steady if m["step_time_s"] > 0)
        if len(steady) > 1
        else 0.0,
    )


def steady_samples_per_cpu_s(job: Any, replicas: int, steps: int, batch: int) -> float | None:
    """Samples per CPU-second of every cluster process from ``WARMUP_S`` after now to 90% of ``steps``."""
    time.sleep(WARMUP_S)
    pids = _descendants(os.getpid())
    start_cpu, start_step = cpu_s(pids), job.global_step()
    deadline = time.perf_counter() + JOB_TIMEOUT_S
    while job.status == "running" and time.perf_counter() < deadline:
        step = job.global_step()
        if step >= 0.9 * steps:
            done = step - start_step
            return done * replicas * batch / max(cpu_s(pids) - start_cpu, 1e-9) if done > 0 else None
        time.sleep(STEADY_POLL_S)
    return None


def single_process(cg: Any, np: Any, models: Any, args: Any) -> dict[str, dict[str, float]]:
    """Seconds per step of ``Session`` training and of the replica's compute, in this process."""
    from train_step import digits_batches  # the same 16 real batches train_step.py times

    from cellgraph.cluster.training_graph import load, prepare

    model = models.mini_inception(optimizer=cg.optim.SGD(LEARNING_RATE))
    batches = [(x[: args.batch], y[: args.batch]) for x, y in digits_batches(np, image_input=True)]
    step = cg.Session(model.graph).make_callable([model.train_op, model.loss], [model.x, model.y])
    tg = prepare(model.loss)
    loaded = load(tg)
    values = {name: np.asarray(v) for name, v in tg.initial.items()}
    cycle = iter(range(10**12))

    def session_step() -> None:
        step(*batches[next(cycle) % len(batches)])

    def replica_compute() -> None:
        loaded.compute(values, batches[next(cycle) % len(batches)])

    repeats, warmup, repeat_seconds = (5, 5, 0.2) if args.quick else (15, 20, 0.5)
    return time_interleaved(
        {"session": session_step, "replica_compute": replica_compute},
        repeats=repeats,
        warmup=warmup,
        repeat_seconds=repeat_seconds,
    )


def empty_cache_first_job(cg: Any, model: Any, data: tuple[Any, Any], args: Any) -> tuple[float, float]:
    """(cluster start s, first-metrics s) of a fresh cluster's first 2-replica job, its kernel caches empty."""
    with tempfile.TemporaryDirectory(prefix="cellgraph-scaling-cache-") as cache:
        caches = {"NUMBA_CACHE_DIR": os.path.join(cache, "numba"), "CELLGRAPH_CACHE_DIR": cache}
        # Cluster.local has no env= for its workers; the Nannies spawn them from this process's environment.
        with environment(**caches):
            start = time.perf_counter()
            with cg.Cluster.local(workers=2, ps=1) as cluster:
                started = time.perf_counter() - start
                run = run_job(cg, cluster, model, data, 2, FIRST_JOB_STEPS, args)
    return started, run.first_metrics_s


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=64, help="rows per replica per step (default 64)")
    p.add_argument(
        "--rounds", type=int, default=None, help="rounds of (1-replica, 2-replica) jobs; default 5, --quick 2"
    )
    p.add_argument("--seconds", type=float, default=None, help="seconds each measured job trains; default 8, --quick 3")
    p.add_argument("--interval", type=float, default=0.25, help="metrics_interval_s of the jobs (default 0.25)")
    cache = p.add_mutually_exclusive_group()
    cache.add_argument(
        "--empty-cache", action="store_true", help="also time a first job with empty kernel caches (--quick)"
    )
    cache.add_argument("--no-empty-cache", action="store_true", help="skip the first job with empty kernel caches")
    args = p.parse_args()
    rounds = args.rounds or (2 if args.quick else 5)
    seconds = args.seconds or (3.0 if args.quick else 8.0)
    measure_empty = args.empty_cache or not (args.quick or args.no_empty_cache)
    setup_threads(args.threads)  # the worker processes inherit the thread counts too
    # A stopping cluster logs harmless heartbeat tracebacks from its workers; keep stdout readable.
    os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "critical")
    started = time.perf_counter()

    import numpy as np

    import cellgraph as cg
    from cellgraph.cluster.cluster import Cluster
    from cellgraph.examples import digits, models

    split = digits.load()
    data = (split.images(split.x_train), split.y_train)
    model = models.mini_inception(optimizer=cg.optim.SGD(LEARNING_RATE))

    timings = single_process(cg, np, models, args)
    session_sps = args.batch / timings["session"]["median"]
    compute_sps = args.batch / timings["replica_compute"]["median"]
    print(
        f"single process, batch {args.batch}: Session step {timings['session']['median'] * 1e3:.2f} ms"
        f" ({session_sps:,.0f} samples/s); replica compute (loss + gradients) "
        f"{timings['replica_compute']['median'] * 1e3:.2f} ms ({compute_sps:,.0f} samples/s)"
    )

    empty_start_s = empty_first_s = None
    if measure_empty:
        empty_start_s, empty_first_s = empty_cache_first_job(cg, model, data, args)
        print(
            f"fresh cluster, empty kernel caches: started in {empty_start_s:.1f} s; "
            f"first metrics {empty_first_s:.1f} s after cg.train (every kernel compiles, in both workers at once)"
        )
    else:
        print("(first job with empty kernel caches not timed: --quick; --empty-cache adds it, about 80 s here)")

    runs: list[JobRun] = []
    # Global steps per second, first guesses (measured here: 55-90 and 30-60); each job then corrects them.
    rate = {1: 50.0, 2: 25.0}
    start = time.perf_counter()
    with Cluster.local(workers=2, ps=1) as cluster:
        cluster_s = time.perf_counter() - start
        # The cluster's first job: fresh processes, the on-disk caches as they are. It also warms both workers.
        fresh = run_job(cg, cluster, model, data, 2, FIRST_JOB_STEPS, args)
        print(
            f"fresh cluster (started in {cluster_s:.1f} s), on-disk kernel caches as found: first metrics "
            f"{fresh.first_metrics_s:.2f} s after cg.train, which itself took {fresh.train_call_s:.2f} s"
        )
        for r in range(rounds):
            for replicas in (1, 2) if r % 2 == 0 else (2, 1):
                steps = max(20, round(rate[replicas] * (WARMUP_S + seconds)))
                run = run_job(cg, cluster, model, data, replicas, steps, args)
                for _ in range(LONGER_TRIES):  # a first guess far too low ends the job before it can be measured
                    if run.sps > 0:
                        break
                    steps *= 4
                    print(f"a {replicas}-replica job ended before its steady state: again with {steps} steps")
                    run = run_job(cg, cluster, model, data, replicas, steps, args)
                if run.sps <= 0:
                    raise RuntimeError(f"a {replicas}-replica job of {steps} steps left too few metrics events")
                rate[replicas] = run.sps / (replicas * args.batch)
                runs.append(run)
                w = run.window_sps
                print(
                    f"round {r}, {replicas} replica(s): {run.sps:8,.0f} samples/s "
                    f"(windows of {args.interval:g} s: median {statistics.median(w):,.0f}, "
                    f"min {min(w):,.0f}, max {max(w):,.0f}); step {run.step_time_ms:.1f} ms; "
                    f"{run.global_steps} global steps; first metrics {run.first_metrics_s:.3f} s "
                    f"(cg.train {run.train_call_s:.3f} s)"
                )

    def median_of(replicas: int, field: str) -> float:
        return statistics.median(getattr(run, field) for run in runs if run.replicas == replicas)

    sps = {n: median_of(n, "sps") for n in (1, 2)}
    per_job = {n: [round(run.sps, 1) for run in runs if run.replicas == n] for n in (1, 2)}
    efficiency = sps[2] / (2 * sps[1])
    first_s = statistics.median(run.first_metrics_s for run in runs)
    spread = {n: (max(per_job[n]) - min(per_job[n])) / sps[n] for n in (1, 2)}
    print(
        f"sps_1 = {sps[1]:,.0f}, sps_2 = {sps[2]:,.0f} samples/s (medians of {rounds} jobs each; "
        f"spread (max - min) / median: {spread[1]:.0%} and {spread[2]:.0%})"
    )
    print(
        f"efficiency_2 = {efficiency:.3f} (target >= {TARGET_EFFICIENCY}: "
        f"{'met' if efficiency >= TARGET_EFFICIENCY else 'NOT met'})"
    )
    print(
        f"first_metrics_s = {first_s:.3f} s (warm; target <= {TARGET_FIRST_METRICS_S:g} s: "
        f"{'met' if first_s <= TARGET_FIRST_METRICS_S else 'NOT met'})"
    )
    samples_per_cpu_s = median_of(2, "samples_per_cpu_s")
    cpu_efficiency = samples_per_cpu_s / session_sps
    steady = [run.samples_per_cpu_s_steady for run in runs if run.replicas == 2 and run.samples_per_cpu_s_steady]
    cpu_efficiency_steady = statistics.median(steady) / session_sps if steady else None
    overlap = statistics.fmean(run.overlap for run in runs if run.replicas == 2)
    print(
        f"cpu_efficiency_vs_local = {cpu_efficiency:.3f} ({samples_per_cpu_s:,.0f} samples per CPU-s of all cluster "
        f"processes vs {session_sps:,.0f} in one process; target >= {TARGET_CPU_EFFICIENCY}: "
        f"{'met' if cpu_efficiency >= TARGET_CPU_EFFICIENCY else 'NOT met'})"
    )
    if cpu_efficiency_steady is not None:
        print(
            f"cpu_efficiency_vs_local_steady = {cpu_efficiency_steady:.3f} (the same, training only: from the end of "
            "the warm-up to 90% of each job's steps, without the job's start)"
        )
    print(
        f"overlap_fraction = {overlap:.3f} (target >= {TARGET_OVERLAP}: {'met' if overlap >= TARGET_OVERLAP else 'NOT met'})"
    )
    print(
        f"1 replica vs single process: {sps[1]:,.0f} vs {session_sps:,.0f} samples/s "
        f"(single process is {session_sps / sps[1]:.1f}x; per-step {median_of(1, 'step_time_ms'):.1f} ms "
        f"vs {timings['session']['median'] * 1e3:.2f} ms)"
    )

    emit(
        {
            "benchmark": "scaling",
            "model": "mini_inception",
            "sps_1": sps[1],
            "sps_2": sps[2],
            "efficiency_2": efficiency,
            "target_efficiency_2": TARGET_EFFICIENCY,
            "efficiency_met": efficiency >= TARGET_EFFICIENCY,
            "sps_1_jobs": per_job[1],
            "sps_2_jobs": per_job[2],
            "step_time_1_ms": median_of(1, "step_time_ms"),
            "step_time_2_ms": median_of(2, "step_time_ms"),
            "first_metrics_s": first_s,
            "target_first_metrics_s": TARGET_FIRST_METRICS_S,
            "first_metrics_met": first_s <= TARGET_FIRST_METRICS_S,
            "first_metrics_cold_s": fresh.first_metrics_s,
            "cold_train_call_s": fresh.train_call_s,
            "cluster_start_s": cluster_s,
            "first_metrics_empty_cache_s": empty_first_s,
            "empty_cache_cluster_start_s": empty_start_s,
            "train_call_s": statistics.median(run.train_call_s for run in runs),
            "session_sps": session_sps,
            "session_step_ms": timings["session"]["median"] * 1e3,
            "replica_compute_sps": compute_sps,
            "replica_compute_ms": timings["replica_compute"]["median"] * 1e3,
            "overhead_1": session_sps / sps[1],
            "cpu_efficiency_vs_local": cpu_efficiency,
            "samples_per_cpu_s_2": samples_per_cpu_s,
            "cpu_efficiency_vs_local_steady": cpu_efficiency_steady,
            "samples_per_cpu_s_2_steady": statistics.median(steady) if steady else None,
            "target_cpu_efficiency": TARGET_CPU_EFFICIENCY,
            "cpu_efficiency_met": cpu_efficiency >= TARGET_CPU_EFFICIENCY,
            "overlap_fraction": overlap,
            "step_time_jitter_sigma": statistics.median(run.jitter_sigma for run in runs if run.replicas == 2),
            "target_overlap_fraction": TARGET_OVERLAP,
            "overlap_met": overlap >= TARGET_OVERLAP,
            "batch": args.batch,
            "optimizer": f"SGD({LEARNING_RATE})",
            "mode": "sync",
            "rounds": rounds,
            "seconds_per_job": seconds,
            "steps_per_job": {str(n): [run.global_steps for run in runs if run.replicas == n] for n in (1, 2)},
            "warmup_s": WARMUP_S,
            "metrics_interval_s": args.interval,
            "threads": args.threads,
            "quick": args.quick,
            "total_s": time.perf_counter() - started,
            "machine": machine(),
            "versions": versions(),
            "thread_pools": thread_pools(),
            "source": source(),
        }
    )


if __name__ == "__main__":  # the cluster's worker processes are spawned: they import this file
    main()
