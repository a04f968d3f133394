"""Communication hidden behind compute for a model of Inception-v3's size class: a 67 MB MLP, one sync replica.

``scaling.py`` measures the overlap on the mini-Inception, whose 32 KB of
gradients leave in one message at the end of backprop: there is nothing there
to hide. ``scaling_model.py`` predicts an Inception-v3-sized job (95 MB), so
its ``overlap`` input comes from here: a replica (``run_replica``, in this
process) trains a five-layer MLP (four 2048 x 2048 dense layers and a
10-way head: 16.8M float32 parameters, 67 MB) on random data, batch
``--batch``, against two ``cellgraph ps`` subprocesses on loopback, sync mode,
SGD with learning rate 0 (the values stay put), ``overlap=True`` then
``overlap=False``.

    python benchmarks/overlap_large.py [--quick] [--batch B]

``overlap_fraction`` (the replica's metric, mean over the steps after the
first ``WARMUP_STEPS``) is the share of each step's communication, from its
first gradient sent to its pull's last byte, that ran while the replica
computed: gradients sent as backprop produces them (``StreamedStep``) and the
pull arriving while the next forward pass starts (``Plan.stream_gated``).
``step_ms_overlap`` / ``step_ms_no_overlap`` (wall time per step of the loop)
are reported, not targets: on two shared cores the servers' work (receiving,
applying, answering) competes with the replica's compute for the same cores,
so hiding the wire time does not shorten the step here as it would with the
servers on other machines.

The last line of stdout is one JSON object.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from contextlib import ExitStack
from typing import Any

from _common import emit, machine, parser, setup_threads, source, versions
from ps_throughput import CALL_TIMEOUT_S, ps_servers

WIDTH = 2048
LAYERS = 4
WARMUP_STEPS = 2  # the first steps compile and fill caches
STEPS = 20
QUICK_STEPS = 8


def build(cg: Any) -> Any:
    """The MLP's loss: LAYERS dense ReLU layers of WIDTH units and a 10-way softmax head."""
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, WIDTH), "float32", name="x")
        y = cg.placeholder((None,), "int32", name="y")
        h = x
        for i in range(LAYERS):
            h = cg.layers.dense(h, WIDTH, activation="relu", name=f"dense{i}")
        return cg.losses.sparse_softmax_cross_entropy(cg.layers.dense(h, 10, name="logits"), y)


def run(np: Any, tg: Any, data: list[Any], steps: int, batch: int, overlap: bool) -> dict[str, float]:
    """One replica's run against two fresh servers: its mean overlap_fraction and loop time per step."""
    from cellgraph.cluster.ps import OptimizerConfig, ParameterClient, TrainingConfig
    from cellgraph.cluster.replica import ReplicaSpec, run_replica

    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        addresses, token, _ = stack.enter_context(ps_servers(2, tmp))
        client = stack.enter_context(ParameterClient(addresses, token, timeout=CALL_TIMEOUT_S))
        client.init("overlap-large", tg.initial, OptimizerConfig("sgd", 0.0), TrainingConfig("sync"))
        messages: list[dict[str, Any]] = []
        spec = ReplicaSpec(
            "overlap-large", 0, tg, addresses, token, mode="sync", batch_size=batch, steps=steps,
            timeout_s=CALL_TIMEOUT_S, overlap=overlap, metrics_interval_s=0.0,
        )  # fmt: skip
        summary = run_replica(spec, data, emit=messages.append)
    steady = [m for m in messages if m["steps"] > WARMUP_STEPS and not m["final"]]
    return {
        "overlap_fraction": statistics.fmean(m["overlap_fraction"] for m in steady),
        "step_ms": summary["seconds"] / summary["steps"] * 1e3,
    }


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=256, help="samples per step (default 256)")
    args = p.parse_args()
    setup_threads(args.threads)
    started = time.perf_counter()

    import numpy as np

    import cellgraph as cg
    from cellgraph.cluster.training_graph import prepare

    tg = prepare(build(cg))
    model_mb = sum(v.nbytes for v in tg.initial.values()) / 1e6
    rng = np.random.default_rng(0)
    data = [
        rng.standard_normal((4 * args.batch, WIDTH), dtype=np.float32),
        rng.integers(0, 10, 4 * args.batch).astype(np.int32),
    ]
    steps = QUICK_STEPS if args.quick else STEPS
    with_overlap = run(np, tg, data, steps, args.batch, overlap=True)
    without = run(np, tg, data, steps, args.batch, overlap=False)
    print(f"model: {model_mb:.1f} MB of float32 parameters, 2 PS shards, 1 sync replica, batch {args.batch}")
    for name, r in (("overlap=True", with_overlap), ("overlap=False", without)):
        print(f"{name}: {r['step_ms']:.0f} ms a step, overlap_fraction {r['overlap_fraction']:.3f}")
    emit(
        {
            "benchmark": "overlap_large",
            "quick": args.quick,
            "model_mb": model_mb,
            "batch": args.batch,
            "steps": steps,
            "overlap_fraction": with_overlap["overlap_fraction"],
            "overlap_fraction_no_overlap": without["overlap_fraction"],
            "step_ms_overlap": with_overlap["step_ms"],
            "step_ms_no_overlap": without["step_ms"],
            "machine": machine(),
            "versions": versions(),
            "source": source(),
            "total_s": time.perf_counter() - started,
        }
    )


if __name__ == "__main__":
    main()
