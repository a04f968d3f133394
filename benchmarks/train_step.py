"""One training step (forward, backward, optimizer update), cellgraph vs PyTorch CPU.

Both sides train the same architecture on the same sklearn digits batches of
64 with the same thread count: with SGD(0.1), the digits MLP (64-128-10) or
the mini-Inception CNN of ``cellgraph.examples.models``; with Adam(3e-3), the
``resnet`` or ``transformer`` of ``cellgraph.examples.deep_models``, whose
PyTorch twins (``train_step_models.py``) start from cellgraph's initial
weights: the two step-0 losses must agree within ``LOSS_TOLERANCE`` or the run
stops. ``--large`` (resnet only) is the compute-bound case: batch 256, the
digits upsampled to 32x32. ``--profile`` adds where the time goes: seconds
per op of a cellgraph step (its plan's steps timed one by one) and of a
PyTorch step (torch.profiler).

    python benchmarks/train_step.py --model mlp|cnn|resnet|transformer [--large] [--profile]
                                    [--training-constant] [--quick] [--threads N] [--no-fuse]

``--training-constant`` (resnet) is a diagnosis, not the model as shipped: it
builds batch norm with ``training=True`` (a Python bool) where the model has a
``training_switch`` placeholder, to measure what the switch costs. The graph
computes both the training and the inference output and selects one with
``where``; a plan whose switch is not fed runs only the branch taken, forward
and backward (``dataflow/switch_fold.py``), so the two should now be within
noise of each other (the folded plan keeps the moving statistics' selects).

``--no-fuse`` builds the cellgraph session with ``fuse=False`` (one kernel per
elementwise op), to measure what elementwise fusion does to the step.

The last line of stdout is one JSON object: samples per second on each side,
``ratio`` = cellgraph / torch (targets: mlp, resnet and transformer >= 1.0, cnn
>= 0.5, resnet --large >= 0.8), the step-0 losses, and the memory
of cellgraph's intermediates during one step: ``peak_bytes`` (tracemalloc, the
feeds subtracted) against ``live_bytes_lower_bound`` (the largest live set of
intermediates in the plan's order, from ``Plan.trace``; target: peak at most
1.25 x the bound).
"""

from __future__ import annotations

import itertools
import time
import tracemalloc
from typing import Any

import train_step_models as deep
from _common import emit, import_torch, machine, parser, setup_threads, source, thread_pools, time_interleaved, versions

BATCH = 64
LARGE_BATCH = 256
LARGE_SIZE = 32  # --large: the 8x8 digits upsampled 4x
WIDTHS = (16, 32, 64)
LEARNING_RATE = 0.1  # SGD, mlp and cnn
ADAM_LEARNING_RATE = 3e-3  # Adam, resnet and transformer (their demo default)
N_BATCHES = 16  # distinct real batches each side cycles through (fewer if the training set runs out)
TARGET_RATIO = {"mlp": 1.0, "cnn": 0.5, "resnet": 1.0, "transformer": 1.0}
TARGET_RATIO_LARGE = 0.8
TARGET_PEAK_OVER_BOUND = 1.25
# float32 sums in different orders (BLAS, oneDNN): the step-0 losses differ by ~1e-6; a wrong
# layer, padding or weight layout moves them by far more.
LOSS_TOLERANCE = 1e-4
DEEP_MODELS = ("resnet", "transformer")


def digits_batches(np: Any, image_input: bool, batch: int = BATCH, upsample: int = 1) -> list[tuple[Any, Any]]:
    """Up to ``N_BATCHES`` shuffled (x, y) training batches of sklearn digits, contiguous; images
    repeated ``upsample`` times along height and width (nearest-neighbour upsampling)."""
    from cellgraph.examples import digits

    data = digits.load()
    x = data.images(data.x_train) if image_input else data.x_train
    if upsample > 1:
        x = np.repeat(np.repeat(x, upsample, axis=1), upsample, axis=2)
    order = np.random.default_rng(0).permutation(len(x))
    return [
        (np.ascontiguousarray(x[idx]), np.ascontiguousarray(data.y_train[idx]))
        for idx in (order[i * batch : (i + 1) * batch] for i in range(min(N_BATCHES, len(x) // batch)))
    ]


# --------------------------------------------------------------- PyTorch side
def torch_mlp(torch: Any) -> Any:
    nn = torch.nn
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))


def torch_mini_inception(torch: Any) -> Any:
    """The mini-Inception of ``models.mini_inception`` in NCHW: same layers, same shapes."""
    nn = torch.nn

    def conv(c_in: int, c_out: int, k: int) -> Any:
        return nn.Sequential(nn.Conv2d(c_in, c_out, k, padding="same"), nn.ReLU())

    class Inception(nn.Module):  # type: ignore[name-defined]  # torch is imported at run time
        def __init__(self, c_in: int, width: int) -> None:
            super().__init__()
            self.b1 = conv(c_in, width, 1)
            self.b3 = nn.Sequential(conv(c_in, width, 1), conv(width, width, 3))
            self.b5 = nn.Sequential(conv(c_in, width, 1), conv(width, width, 5))
            # TensorFlow's SAME max pool ignores the padding; PyTorch pads with -inf: the same.
            self.bp = nn.Sequential(nn.MaxPool2d(3, 1, padding=1), conv(c_in, width, 1))

        def forward(self, x: Any) -> Any:
            return torch.cat([self.b1(x), self.b3(x), self.b5(x), self.bp(x)], dim=1)

    return nn.Sequential(conv(1, 16, 3), Inception(16, 8), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4 * 4 * 32, 10))


def torch_step(torch: Any, model: str, values: dict[str, Any], size: int) -> tuple[Any, Any]:
    """(a step function of (x, y) returning the loss, the module); a deep model starts from cellgraph's ``values``."""
    torch.manual_seed(0)
    copies: list[deep.Copy] = []
    if model == "resnet":
        net = deep.torch_resnet(torch, size, WIDTHS, copies)
    elif model == "transformer":
        net = deep.torch_transformer(torch, 32, 4, copies)
    else:
        net = torch_mlp(torch) if model == "mlp" else torch_mini_inception(torch)
    deep.copy_weights(torch, copies, values)
    net.train()  # batch norm normalizes with the batch's statistics, as cellgraph's training switch does
    if model in DEEP_MODELS:
        opt = torch.optim.Adam(net.parameters(), lr=ADAM_LEARNING_RATE)
    else:
        opt = torch.optim.SGD(net.parameters(), lr=LEARNING_RATE)
    cross_entropy = torch.nn.functional.cross_entropy

    def step(x: Any, y: Any) -> Any:
        opt.zero_grad(set_to_none=True)
        loss = cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        return loss

    return step, net


def torch_batches(torch: Any, batches: list[tuple[Any, Any]], image_input: bool) -> list[tuple[Any, Any]]:
    out = []
    for x, y in batches:
        xt = torch.from_numpy(x.transpose(0, 3, 1, 2).copy() if image_input else x.copy())  # NHWC -> NCHW
        out.append((xt, torch.from_numpy(y.astype("int64"))))
    return out


def check_step0(model: str, cg_loss: float, torch_loss: float, same_start: bool) -> float:
    """Print both step-0 losses; with ``same_start`` (copied weights) stop unless they agree. Returns |difference|."""
    diff = abs(cg_loss - torch_loss)
    checked = f"|difference| {diff:.2e}" if same_start else "each side's own initial weights: not compared"
    print(f"step-0 loss: cellgraph {cg_loss:.6f}, torch {torch_loss:.6f}, {checked}")
    if same_start and not diff <= LOSS_TOLERANCE:  # `not <=`: a NaN difference stops too
        raise SystemExit(
            f"step-0 losses differ by {diff:.3g} > {LOSS_TOLERANCE}: the PyTorch {model} is not the same "
            "model as cellgraph's, and its timing would compare different work"
        )
    return diff


# ------------------------------------------------------------- cellgraph side
def peak_step_bytes(np: Any, step: Any, x: Any, y: Any) -> tuple[int, int]:
    """(peak, retained) bytes traced during one warm ``step``, the feeds' bytes subtracted."""
    tracemalloc.start()
    try:
        feeds = (np.array(x), np.array(y))  # traced, then taken out as the baseline
        tracemalloc.reset_peak()
        baseline, _ = tracemalloc.get_traced_memory()
        result = step(*feeds)
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del result
    return peak - baseline, current - baseline


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--model", choices=sorted(TARGET_RATIO), required=True)
    p.add_argument("--no-fuse", action="store_true", help="cellgraph without elementwise fusion: Session(fuse=False)")
    p.add_argument(
        "--large", action="store_true", help=f"resnet at batch {LARGE_BATCH} on {LARGE_SIZE}x{LARGE_SIZE} inputs"
    )
    p.add_argument(
        "--training-constant",
        action="store_true",
        help="diagnosis: batch norm built with training=True instead of the model's training_switch placeholder",
    )
    p.add_argument("--profile", action="store_true", help="print (and emit) seconds per op of one step on each side")
    args = p.parse_args()
    if args.large and args.model != "resnet":
        raise SystemExit(f"--large is the resnet's compute-bound case; --model {args.model} has none")
    if args.training_constant and args.model != "resnet":
        raise SystemExit(f"--training-constant is about batch norm's switch; --model {args.model} has no batch norm")
    setup_threads(args.threads)
    started = time.perf_counter()

    import numpy as np

    import cellgraph as cg
    from cellgraph.examples import deep_models, models

    name = f"train_step_{args.model}{'_large' if args.large else ''}{'_training_constant' if args.training_constant else ''}"
    torch = import_torch(args.threads, name)

    batch, size = (LARGE_BATCH, LARGE_SIZE) if args.large else (BATCH, 8)
    if args.model in DEEP_MODELS:
        optimizer, optimizer_name = cg.optim.Adam(ADAM_LEARNING_RATE), f"Adam({ADAM_LEARNING_RATE})"
    else:
        optimizer, optimizer_name = cg.optim.SGD(LEARNING_RATE), f"SGD({LEARNING_RATE})"
    build = {
        "mlp": models.mlp,
        "cnn": models.mini_inception,
        "resnet": deep_models.resnet,
        "transformer": deep_models.transformer,
    }[args.model]
    with deep.training_constant(cg, args.training_constant):
        model = deep.resnet_large(cg, optimizer, LARGE_SIZE, WIDTHS) if args.large else build(optimizer=optimizer)
    batches = digits_batches(np, model.image_input, batch, size // 8)
    fuse = not args.no_fuse
    sess = cg.Session(model.graph, fuse=fuse)
    step = sess.make_callable([model.train_op, model.loss], [model.x, model.y])
    initial = sess.variable_values()  # before any step: the PyTorch twin starts from these

    jit_start = time.perf_counter()
    (first_loss,) = step(*batches[0])  # Numba compiles (or loads from its cache) every kernel
    first_step_s = time.perf_counter() - jit_start

    t_step, _ = torch_step(torch, args.model, initial, size)
    t_batches = torch_batches(torch, batches, model.image_input)
    t_first_loss = t_step(*t_batches[0]).item()
    same_start = args.model in DEEP_MODELS  # mlp and cnn keep each side's own initialisation (their records did)
    loss_diff = check_step0(args.model, float(first_loss), t_first_loss, same_start)

    cg_cycle = itertools.cycle(batches)
    t_cycle = itertools.cycle(t_batches)
    sides = {"cellgraph": lambda: step(*next(cg_cycle)), "torch": lambda: t_step(*next(t_cycle))}
    repeats, warmup, repeat_seconds = (5, 5, 0.2) if args.quick else (15, 20, 1.0)
    if args.large and args.quick:
        repeats, warmup = 3, 1  # a step is ~0.1-1 s here: the quick run stays under a minute
    timings = time_interleaved(sides, repeats=repeats, warmup=warmup, repeat_seconds=repeat_seconds)
    sps = {side: batch / t["median"] for side, t in timings.items()}
    ratio = sps["cellgraph"] / sps["torch"]

    # Memory: one warm step under tracemalloc, and the plan's own lower bound.
    peak_bytes, retained_bytes = peak_step_bytes(np, step, *batches[1])
    (last_loss,), live_bound = step.trace(*batches[2])
    t_last_loss = t_step(*t_batches[2]).item()
    for side, loss in (("cellgraph", first_loss), ("cellgraph", last_loss), ("torch", t_last_loss)):
        if not np.isfinite(loss):
            raise SystemExit(f"{side} loss is not finite ({loss}): the step is broken, its timing means nothing")

    profiles: dict[str, list[tuple[str, float, int]]] = {}
    if args.profile:
        n = 2 if args.quick else 5
        profiles["cellgraph"] = deep.profile_plan(step, batches[3 % len(batches)], n)
        profiles["torch"] = deep.torch_profile(torch, t_step, t_batches[3 % len(t_batches)], n)
        for side, rows in profiles.items():
            total = sum(r[1] for r in rows)
            print(f"{side} profile ({total * 1e3:.1f} ms per step in ops; slowest first):")
            for op, seconds, calls in rows[:12]:
                print(f"  {op:<36} {seconds * 1e3:9.2f} ms {100 * seconds / total:5.1f}%  {calls:4d} calls")

    target = TARGET_RATIO_LARGE if args.large else TARGET_RATIO[args.model]
    plan_calls = sum(1 for s in step.steps if not s.constant)  # fused segments count once
    peak_over_bound = peak_bytes / live_bound if live_bound else float("inf")
    for side, t in timings.items():
        print(
            f"{side:>10}: {sps[side]:10.0f} samples/s  ({t['median'] * 1e3:.3f} ms/step, min {t['min'] * 1e3:.3f},"
            f" max {t['max'] * 1e3:.3f}; {repeats} repeats x {t['calls_per_repeat']} steps)"
        )
    print(f"fusion {'on' if fuse else 'off'}: {plan_calls} calls for {len(step.order)} plan nodes")
    print(f"ratio cellgraph / torch = {ratio:.3f} (target >= {target}: {'met' if ratio >= target else 'NOT met'})")
    print(
        f"peak {peak_bytes} B vs live lower bound {live_bound} B = {peak_over_bound:.3f}"
        f" (target <= {TARGET_PEAK_OVER_BOUND}: {'met' if peak_over_bound <= TARGET_PEAK_OVER_BOUND else 'NOT met'})"
    )
    print(
        f"loss: cellgraph {float(first_loss):.4f} -> {float(last_loss):.4f}, torch {t_first_loss:.4f} -> {t_last_loss:.4f}"
    )

    emit(
        {
            "benchmark": name,
            "model": args.model,
            "large": args.large,
            "training_constant": args.training_constant,
            "input_size": size,
            "first_loss_cellgraph": float(first_loss),
            "first_loss_torch": t_first_loss,
            "first_loss_diff": loss_diff,
            "same_initial_weights": same_start,
            "cellgraph_sps": sps["cellgraph"],
            "torch_sps": sps["torch"],
            "ratio": ratio,
            "target_ratio": target,
            "ratio_met": ratio >= target,
            "cellgraph_step_ms": timings["cellgraph"]["median"] * 1e3,
            "torch_step_ms": timings["torch"]["median"] * 1e3,
            "peak_bytes": peak_bytes,
            "live_bytes_lower_bound": live_bound,
            "peak_over_bound": peak_over_bound,
            "target_peak_over_bound": TARGET_PEAK_OVER_BOUND,
            "peak_met": peak_over_bound <= TARGET_PEAK_OVER_BOUND,
            "retained_bytes": retained_bytes,
            "fuse": fuse,
            "plan_nodes": len(step.order),
            "plan_calls": plan_calls,
            "batch": batch,
            "optimizer": optimizer_name,
            "profile": {
                side: [[op, seconds * 1e3, calls] for op, seconds, calls in rows[:12]]
                for side, rows in profiles.items()
            },
            "threads": args.threads,
            "quick": args.quick,
            "repeats": repeats,
            "first_step_s": first_step_s,
            "total_s": time.perf_counter() - started,
            "machine": machine(),
            "versions": versions(),
            "thread_pools": thread_pools(),
            "source": source(),
        }
    )


if __name__ == "__main__":
    main()
