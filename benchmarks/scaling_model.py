"""A model, not a measurement: sync training throughput of an Inception-v3-sized job on 1-128 workers, 1-16 PS shards.

It predicts what cellgraph's design (each replica computes, then one
push-pull of the whole model through the parameter service; sync mode, the
first ``k = n - backups`` gradients make the step) would do at a scale this
machine cannot run, from figures measured here and one stated figure:

- the parameter service's throughput, ``--ps-gbps`` for ``--ps-shards-measured``
  shards (default 0.66 GB/s for 2 shards, BENCHMARKS.md section 4: 2 x model
  bytes / (pull s + push s), pushes applied by the servers included), taken
  as ``ps_gbps / shards`` per shard, shared by every worker; one worker moves
  at most ``ps_gbps`` (one client reached that over 2 shards);
- its round trip, ``--latency-ms`` (default 1.48 ms, ``push_pull`` p50);
- a fixed cost per step beyond compute and the round trip, calibrated from
  the mini-Inception: ``--mini-step-ms`` (a 1-replica distributed step,
  ``scaling.py``'s ``step_time_1_ms``) - ``--mini-compute-ms`` (the replica's
  compute in one process, ``replica_compute_ms``) - latency - the
  mini-model's transfer time;
- the compute of one Inception-v3 step per worker, ``--step-s``: 3.38 s per
  batch of 32 on a Tesla K40c, the steady-state ``sec/batch`` of the log in
  the TensorFlow models repository's ``inception/README.md`` (2016, single
  GPU). ``--fast-step-s`` (0.25 s, an assumption: a GPU about 13x faster)
  shows how the picture changes when compute shrinks and traffic does not.

Stragglers: each worker's compute time is lognormal with median ``step_s``
and shape sigma, independent across workers and steps; a sync step waits for
the k-th fastest of n (the expected k-th order statistic, by quadrature). All
n workers push and pull (a backup's late gradient still crosses the network);
``k`` batches count. A share ``--overlap`` of the transfer runs while the step
computes (gradients leave during backprop, the pull arrives during the next
forward pass: ``overlap_large.py``'s ``overlap_fraction``, measured on a 67
MB model; the mini-Inception's 32 KB leave in one message and show nothing);
the rest adds to the step. The network is the PS's: no
switch or NIC limit is modelled beyond it.

Shards: dedicated parameter servers (1-16), or colocated (``cg.train(
ps_placement="colocated")``: one shard in each worker, so there are as many
shards as workers and the servers' bandwidth grows with the job).

Measured inputs: ``--measured FILE ...`` reads the last JSON line of runs of
``ps_throughput.py`` (``ps_gbps``, its ``shards``), ``ps_latency.py``
(``p50_ms``), ``scaling.py`` (``step_time_1_ms``, ``replica_compute_ms``,
``step_time_jitter_sigma``) and ``overlap_large.py`` (``overlap_fraction``),
saved by the caller; each
input that no file gives keeps its default, and the output says which inputs
were measured (and in which file) and which were assumed.

    python benchmarks/scaling_model.py [--quick] [--measured F ...] [--step-s S] [--sigma X] ...

The last line of stdout is one JSON object: ``efficiency_at_100`` (100
workers, colocated shards, sigma 0.03, the best number of backups),
``efficiency_at_100_sigma_0_1`` (the same, sigma 0.1), the dedicated-shard
figure and the whole table.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from _common import emit, parser, setup_threads, source

WORKERS = (1, 2, 4, 8, 16, 32, 64, 100, 128)
SHARDS = (1, 2, 4, 8, 16)
COLOCATED = 0  # in the shard column: one shard in each worker
TARGET_AT_100 = 0.9  # sigma 0.03, colocated (issue 15)
TARGET_AT_100_SIGMA_0_1 = 0.8
# Where each measured input comes from: (benchmark, key in its last JSON line).
MEASURED_KEYS = {
    "ps_gbps": ("ps_throughput", "ps_gbps"),
    "ps_shards_measured": ("ps_throughput", "shards"),
    "latency_ms": ("ps_latency", "p50_ms"),
    "mini_step_ms": ("scaling", "step_time_1_ms"),
    "mini_compute_ms": ("scaling", "replica_compute_ms"),
    "overlap": ("overlap_large", "overlap_fraction"),
    "measured_sigma": ("scaling", "step_time_jitter_sigma"),
}
INCEPTION_V3_PARAMS = 23_800_000
MINI_INCEPTION_PARAMS = 8_026  # models.mini_inception(): conv stem, Inception block, dense head
ANCHORS = {
    "TensorFlow 0.8, Inception-v3, 100 GPUs (56x speed-up)": 0.56,
    "Horovod, Inception-V3, 512 GPUs": 0.90,
}


@dataclass(frozen=True)
class Params:
    """The model's inputs (see the module docstring for where each comes from)."""

    params: int
    batch: int
    step_s: float
    sigma: float
    ps_gbps: float
    ps_shards_measured: int
    latency_s: float
    overhead_s: float
    overlap: float = 0.0  # share of the transfer that runs while the step computes

    @property
    def model_bytes(self) -> float:
        return 4.0 * self.params  # float32


@dataclass(frozen=True)
class Point:
    """One predicted configuration."""

    workers: int
    shards: int
    backups: int
    step_s: float
    compute_s: float
    comm_s: float
    samples_per_s: float
    efficiency: float


def kth_fastest(n: int, k: int, median_s: float, sigma: float) -> float:
    """Expected k-th smallest of n lognormal(log median_s, sigma) times (k = n: the slowest)."""
    import numpy as np
    from scipy.special import gammaln, log_ndtr

    if sigma == 0:
        return median_s
    z = np.linspace(-9.0, 9.0, 6001)
    log_coef = gammaln(n + 1) - gammaln(k) - gammaln(n - k + 1)
    log_density = log_coef + (k - 1) * log_ndtr(z) + (n - k) * log_ndtr(-z) - 0.5 * z * z - 0.5 * math.log(2 * math.pi)
    return float(np.trapezoid(median_s * np.exp(sigma * z + log_density), z))


def comm_s(p: Params, workers: int, shards: int, params: int | None = None) -> float:
    """Seconds to push the gradients and pull the values of one step, every worker at once."""
    nbytes = 4.0 * (params if params is not None else p.params)
    per_shard_bps = p.ps_gbps * 1e9 / p.ps_shards_measured
    shard_bound = 2 * workers * nbytes / (shards * per_shard_bps)  # each shard moves n x (its part) each way
    client_bound = 2 * nbytes / (p.ps_gbps * 1e9)  # one worker's own pull + push
    return max(shard_bound, client_bound) + p.latency_s


def predict(p: Params, workers: int, shards: int, backups: int) -> Point:
    k = workers - backups
    compute = kth_fastest(workers, k, p.step_s, p.sigma)
    comm = comm_s(p, workers, workers if shards == COLOCATED else shards)
    step = compute + (1.0 - p.overlap) * comm + p.overhead_s
    samples = k * p.batch / step
    single = p.batch / (p.step_s * math.exp(p.sigma**2 / 2))  # one GPU, no parameter service: its mean step
    return Point(workers, shards, backups, step, compute, comm, samples, samples / (workers * single))


def best(p: Params, workers: int, shards: int) -> Point:
    """The best number of backup workers (0 to a quarter of the workers) for this configuration."""
    return max((predict(p, workers, shards, b) for b in range(workers // 4 + 1)), key=lambda pt: pt.samples_per_s)


def table(p: Params) -> list[Point]:
    return [best(p, n, s) for n in WORKERS for s in (*SHARDS, COLOCATED)]


def at(points: list[Point], workers: int, colocated: bool | None = None) -> Point:
    """The best point at ``workers``: of the colocated shards (True), the dedicated ones (False), or any."""
    return max(
        (pt for pt in points if pt.workers == workers and colocated in (None, pt.shards == COLOCATED)),
        key=lambda pt: pt.samples_per_s,
    )


def measured_inputs(files: list[str]) -> dict[str, tuple[float, str]]:
    """Each input a file gives: its value and the file's name (the last JSON line of a benchmark's run)."""
    found: dict[str, tuple[float, str]] = {}
    for name in files:
        lines = [line for line in Path(name).read_text().splitlines() if line.strip()]
        if not lines:
            raise SystemExit(f"--measured {name}: the file is empty; save a benchmark's stdout in it")
        try:
            result = json.loads(lines[-1])
        except json.JSONDecodeError as err:
            raise SystemExit(f"--measured {name}: its last line is not a benchmark's JSON line ({err})") from None
        for field, (benchmark, key) in MEASURED_KEYS.items():
            if result.get("benchmark") == benchmark and isinstance(result.get(key), int | float):
                found[field] = (float(result[key]), name)
    return found


def print_table(points: list[Point], title: str) -> None:
    print(title)
    print(
        f"{'workers':>8} | "
        + " | ".join(f"{s:>2} shard{'s' if s > 1 else ' '}  " for s in SHARDS)
        + " |  colocated "
        + " | best: samples/s"
    )
    for n in WORKERS:
        row = {pt.shards: pt for pt in points if pt.workers == n}
        top = at(points, n)
        cells = " | ".join(f"{row[s].efficiency:6.1%} b={row[s].backups:<2}" for s in (*SHARDS, COLOCATED))
        print(f"{n:>8} | {cells} | {top.samples_per_s:8,.1f} ({top.shards} shards, {top.backups} backups)")


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--params", type=int, default=INCEPTION_V3_PARAMS, help="float32 parameters (Inception-v3: 23.8M)")
    p.add_argument("--batch", type=int, default=32, help="batch per worker (default 32)")
    p.add_argument(
        "--step-s", type=float, default=3.38, help="compute s per step on one GPU (K40c, TF inception README)"
    )
    p.add_argument("--fast-step-s", type=float, default=0.25, help="a faster GPU's step, for comparison (assumed)")
    p.add_argument(
        "--sigma", type=float, default=0.03, help="lognormal shape of a worker's step time (0.03; 0.1 reported too)"
    )
    p.add_argument(
        "--overlap", type=float, default=0.601, help="share of the transfer hidden (overlap_large.py; 0.601)"
    )
    p.add_argument("--measured", nargs="*", default=[], metavar="FILE", help="benchmark outputs to take inputs from")
    p.add_argument(
        "--ps-gbps", type=float, default=0.66, help="measured PS throughput, both ways (BENCHMARKS.md: 0.66)"
    )
    p.add_argument("--ps-shards-measured", type=int, default=2, help="shards of that measurement (2)")
    p.add_argument("--latency-ms", type=float, default=1.48, help="measured push_pull round trip, p50 (1.48 ms)")
    p.add_argument(
        "--mini-step-ms", type=float, default=20.0, help="measured 1-replica mini-Inception step (scaling.py)"
    )
    p.add_argument("--mini-compute-ms", type=float, default=5.0, help="its compute alone, one process (scaling.py)")
    args = p.parse_args()
    setup_threads(args.threads)

    measured = measured_inputs(args.measured)
    for field, (value, _) in measured.items():
        if field != "measured_sigma":
            setattr(args, field, int(value) if field == "ps_shards_measured" else value)
    print("inputs measured: " + (", ".join(f"{f} = {v:g} ({n})" for f, (v, n) in measured.items()) or "none"))
    assumed = [f for f in MEASURED_KEYS if f not in measured and f != "measured_sigma"]
    print(
        "inputs assumed (defaults: the figures of BENCHMARKS.md sections 4 and 5, or stated assumptions): "
        + ", ".join(f"{f} = {getattr(args, f):g}" for f in assumed)
        + f"; step_s = {args.step_s:g} (TensorFlow's 2016 log), sigma = {args.sigma:g} and 0.1 (assumed"
        + (
            f"; the LocalCluster's window-mean jitter measured {measured['measured_sigma'][0]:.3f}"
            if "measured_sigma" in measured
            else ""
        )  # fmt: skip
        + ")"
    )

    latency = args.latency_ms / 1e3
    base = Params(args.params, args.batch, args.step_s, args.sigma, args.ps_gbps, args.ps_shards_measured, latency, 0.0)
    mini_comm = comm_s(base, 1, 1, params=MINI_INCEPTION_PARAMS)
    overhead = max(0.0, (args.mini_step_ms - args.mini_compute_ms) / 1e3 - mini_comm)
    model = Params(**{**asdict(base), "overhead_s": overhead, "overlap": args.overlap})

    print("THIS IS A MODEL, NOT A MEASUREMENT: predicted from the measured figures below and stated assumptions.")
    print(
        f"inputs: {args.params / 1e6:.1f}M float32 parameters ({model.model_bytes / 1e6:.1f} MB), batch {args.batch}, "
        f"compute {args.step_s:g} s/step (median; lognormal sigma {args.sigma:g}); PS {args.ps_gbps:g} GB/s for "
        f"{args.ps_shards_measured} shards = {args.ps_gbps / args.ps_shards_measured:.3f} GB/s per shard; "
        f"round trip {args.latency_ms:g} ms; fixed cost per step {overhead * 1e3:.1f} ms (mini-Inception: "
        f"{args.mini_step_ms:g} ms step - {args.mini_compute_ms:g} ms compute - {mini_comm * 1e3:.2f} ms round trip); "
        f"{args.overlap:.0%} of the transfer hidden behind compute"
    )
    points = table(model)
    print_table(points, f"\nefficiency (vs one GPU without a PS) and best backups b, compute {args.step_s:g} s/step:")
    fast = Params(**{**asdict(model), "step_s": args.fast_step_s})
    fast_points = table(fast)
    print_table(fast_points, f"\nthe same with compute {args.fast_step_s:g} s/step:")

    top, top_fast = at(points, 100, colocated=True), at(fast_points, 100, colocated=True)
    dedicated = at(points, 100, colocated=False)
    at_sigma_0_1 = at(table(replace(model, sigma=0.1)), 100, colocated=True)
    sensitivity = {
        f"sigma_{s:g}": at(table(replace(model, sigma=s)), 100, colocated=True).efficiency for s in (0.0, 0.3, 0.5)
    }
    met = top.efficiency >= TARGET_AT_100 and at_sigma_0_1.efficiency >= TARGET_AT_100_SIGMA_0_1
    print(
        f"\nefficiency_at_100 = {top.efficiency:.3f} (colocated shards, sigma {args.sigma:g}, {top.backups} backups, "
        f"{top.samples_per_s:,.0f} samples/s; per step {top.compute_s:.2f} s compute + {top.comm_s:.2f} s transfer, "
        f"{args.overlap:.0%} of it hidden; target >= {TARGET_AT_100})"
    )
    print(
        f"efficiency_at_100_sigma_0_1 = {at_sigma_0_1.efficiency:.3f} (target >= {TARGET_AT_100_SIGMA_0_1}); "
        f"with the best of 1-16 dedicated shards instead: {dedicated.efficiency:.3f} ({dedicated.shards} shards); "
        f"targets {'met' if met else 'NOT met'}"
    )
    print(
        f"  with {args.fast_step_s:g} s compute: {top_fast.efficiency:.3f} ({top_fast.shards} shards, "
        f"{top_fast.backups} backups: {top_fast.comm_s:.2f} s of transfer per step)"
    )
    print("  sigma: " + ", ".join(f"{k.split('_')[1]} -> {v:.3f}" for k, v in sensitivity.items()))
    print("anchors (measured by others, on real clusters): " + "; ".join(f"{k}: {v:.0%}" for k, v in ANCHORS.items()))

    emit(
        {
            "benchmark": "scaling_model",
            "is_model": True,
            "efficiency_at_100": top.efficiency,
            "efficiency_at_100_sigma_0_1": at_sigma_0_1.efficiency,
            "efficiency_at_100_dedicated": dedicated.efficiency,
            "target_efficiency_at_100": TARGET_AT_100,
            "target_efficiency_at_100_sigma_0_1": TARGET_AT_100_SIGMA_0_1,
            "targets_met": met,
            "measured": {f: {"value": v, "file": n} for f, (v, n) in measured.items()},
            "best_shards_at_100": dedicated.shards,
            "backups_at_100": top.backups,
            "samples_per_s_at_100": top.samples_per_s,
            "efficiency_at_100_fast_step": top_fast.efficiency,
            "efficiency_at_100_sigma": sensitivity,
            "overhead_ms": overhead * 1e3,
            "inputs": {
                "params": args.params,
                "batch": args.batch,
                "step_s": args.step_s,
                "fast_step_s": args.fast_step_s,
                "sigma": args.sigma,
                "ps_gbps": args.ps_gbps,
                "ps_shards_measured": args.ps_shards_measured,
                "latency_ms": args.latency_ms,
                "mini_step_ms": args.mini_step_ms,
                "mini_compute_ms": args.mini_compute_ms,
                "overlap": args.overlap,
            },
            "anchors": ANCHORS,
            "table": [asdict(pt) for pt in points],
            "table_fast_step": [asdict(pt) for pt in fast_points],
            "quick": args.quick,
            "source": source(),
        }
    )


if __name__ == "__main__":
    main()
