"""Overlap on a shaped network: mini-Inception across hosts, gradients sent during backprop vs after it.

A scheduler, one PS host and two worker hosts, each in its own network
namespace (``cellgraph.testing.netns``), every host's outgoing link shaped
with ``tc netem`` (``--rate`` 1 Gbit/s and ``--delay`` 0.2 ms one way, as a
real rack). On that cluster, 2-replica sync jobs of the mini-Inception
(batch ``--batch``, SGD) run in turns with ``cg.train(overlap=True)`` (each
gradient leaves the moment backprop computes it) and ``overlap=False`` (all
of them after the backward pass), the same number of global steps each.

    sudo python benchmarks/netns_scaling.py [--quick]

Needs root (CAP_NET_ADMIN), iproute2 and tc; elsewhere it says why and
prints ``{"skipped": ...}`` as its last line. Measured per job: the
steady-state step time (global steps over wall time after a warm-up, from
replica 0's metrics events) and the mean ``overlap_fraction``. The last line
of stdout is one JSON object: ``overlap_step_ratio`` = step time with overlap
/ without (median over the rounds; target at most 0.7), and the figures
behind it.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from _common import emit, machine, parser, setup_threads, source, versions
from scaling import WARMUP_S, steady_state

TARGET_RATIO = 0.7
LEARNING_RATE = 0.1
START_S = 60.0
JOB_TIMEOUT_S = 300.0


def run_job(cg: Any, cluster: Any, model: Any, data: tuple[Any, Any], steps: int, batch: int, overlap: bool) -> dict:
    """Train ``steps`` global steps; the steady-state step time and the mean overlap_fraction."""
    job = cg.train(
        model.loss, data, cluster=cluster, optimizer=cg.optim.SGD(LEARNING_RATE), replicas=2, batch_size=batch,
        steps=steps, mode="sync", checkpoint_every=None, metrics_interval_s=0.25, timeout_s=JOB_TIMEOUT_S,
        overlap=overlap,
    )  # fmt: skip
    try:
        job.wait(JOB_TIMEOUT_S)
        metrics = list(job.metrics)
    finally:
        job.close()
    sps, _ = steady_state(metrics, 2, batch, WARMUP_S)
    t0 = min(m["time"] for m in metrics)
    steady = [m for m in metrics if m["time"] >= t0 + WARMUP_S and not m["final"]]
    return {
        "overlap": overlap,
        "step_ms": 2 * batch / sps * 1e3,
        "overlap_fraction": statistics.fmean(m.get("overlap_fraction", 0.0) for m in steady),
    }


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--rate", default="1gbit", help="each host's outgoing rate (tc netem syntax); default 1gbit")
    p.add_argument("--delay", default="0.2ms", help="each host's one-way added delay; default 0.2ms")
    p.add_argument("--batch", type=int, default=64)
    args = p.parse_args()
    setup_threads(args.threads)
    started = time.perf_counter()

    from cellgraph.testing.netns import cannot_make_namespaces, connect, dask_cluster

    why = cannot_make_namespaces()
    if why:
        print(f"skipped: no network namespaces here: {why}")
        emit({"benchmark": "netns_scaling", "skipped": why, "source": source(), "machine": machine()})
        return

    import cellgraph as cg
    from cellgraph.examples import digits, models

    rounds, steps = (1, 500) if args.quick else (3, 1500)
    data = digits.load()
    train = (data.images(data.x_train), data.y_train)
    runs: list[dict] = []
    with dask_cluster(workers=2) as hosts:
        no_delay = {hosts.shape(role, args.rate, args.delay) for role in hosts.namespaces} - {None}
        delay = args.delay if not no_delay else "none"
        for why_not in no_delay:
            print(f"note: {why_not}")
        cluster = connect(hosts, workers=3, timeout=START_S)
        try:
            model = models.mini_inception()
            # Warm-up: every worker compiles the model's kernels (not measured).
            cg.train(
                model.loss, train, cluster=cluster, replicas=2, batch_size=args.batch, steps=30, checkpoint_every=None,
                timeout_s=JOB_TIMEOUT_S,
            ).wait(JOB_TIMEOUT_S).close()  # fmt: skip
            for i in range(rounds):
                for overlap in (True, False) if i % 2 == 0 else (False, True):  # turns: a slow spell hits both
                    runs.append(run_job(cg, cluster, model, train, steps, args.batch, overlap))
                    print(f"overlap={overlap}: {runs[-1]['step_ms']:.2f} ms a step, "
                          f"overlap_fraction {runs[-1]['overlap_fraction']:.3f}")  # fmt: skip
        finally:
            cluster.close()

    with_overlap = statistics.median(r["step_ms"] for r in runs if r["overlap"])
    without = statistics.median(r["step_ms"] for r in runs if not r["overlap"])
    ratio = with_overlap / without
    met = ratio <= TARGET_RATIO
    print(
        f"step time with overlap {with_overlap:.2f} ms, without {without:.2f} ms: ratio {ratio:.3f} "
        f"(target <= {TARGET_RATIO}: {'met' if met else 'NOT met'}); links {args.rate}, {delay} added delay one way"
    )
    emit(
        {
            "benchmark": "netns_scaling",
            "quick": args.quick,
            "rate": args.rate,
            "delay": delay,
            "delay_not_applied": sorted(no_delay),
            "batch": args.batch,
            "steps_per_job": steps,
            "rounds": rounds,
            "step_ms_overlap": with_overlap,
            "step_ms_no_overlap": without,
            "overlap_step_ratio": ratio,
            "target_overlap_step_ratio": TARGET_RATIO,
            "target_met": met,
            "overlap_fraction": statistics.fmean(r["overlap_fraction"] for r in runs if r["overlap"]),
            "runs": runs,
            "total_s": time.perf_counter() - started,
            "source": source(),
            "machine": machine(),
            "versions": versions(),
        }
    )


if __name__ == "__main__":
    main()
