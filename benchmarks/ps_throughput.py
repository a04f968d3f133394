"""Parameter-service throughput: pull and push a 25M-parameter float32 model (100 MB), to one shard and to two.

The model has the size of Inception-v3 and a realistic mix of variables: a
few 2-4M-element matrices, a few dozen 0.5M-element ones, and a couple of
hundred small kernels and biases. ``cellgraph ps`` servers run as real
subprocesses on loopback; the benchmark process is the client
(``ParameterClient``, SGD with learning rate 0, so pushes leave the values
alone; pulls land in reused buffers, ``pull(out=...)``, as a replica's do).
The side ``ps`` is one shard: one server process, as each anchor has, so the
two compare the same topology; ``ps2`` (reported) spreads the model over two
shards, which on two cores makes three busy processes. Beside them, in the
same run and in turns, the anchors (``ps_throughput_anchors.py``) move the
same bytes:

- ``grpc``: bare gRPC Python, the yardstick. A subprocess server with a
  generic handler and raw-bytes (identity) serializers: a stream-unary
  ``Push`` that receives chunks into a preallocated buffer and a
  unary-stream ``Pull`` that sends the model back as chunks, each made from
  its memory as it goes. The client streams the model as messages made from
  its memory the same way (``grpc*_prebuilt_push``, reported: messages made
  once before the timed calls) and copies pulled chunks into a preallocated
  buffer. Measured at 1, 2 and 4 MiB chunks; the best counts;
- ``tcp``: a plain socket to a subprocess, ``sendall`` of each variable's
  memoryview one way and ``recv_into`` preallocated buffers the other way
  (reported: the ceiling of the loopback);
- ``dask``: ``Client.scatter(direct=True)`` of the same arrays to a one-worker
  ``LocalCluster`` (``processes=True``) and ``Client.gather`` back (reported).

    python benchmarks/ps_throughput.py [--quick]

Each side's rate is (model bytes) / (seconds) per direction; ``*_gbps`` is both
directions together, 2 x model bytes / median(pull seconds + push seconds), so
the slower direction weighs as much as it costs. ``*_cpu_s_per_gb`` is the
CPU-seconds of all the side's processes (this one plus its servers) over the
timed calls, per GB moved. The last line of stdout is one JSON object;
targets: ``ratio_vs_grpc`` (ps_gbps / grpc_gbps) >= 0.8 and
``cpu_s_per_gb_ratio_vs_grpc`` (PS CPU-s/GB over bare gRPC's) <= 1.5;
``ratio_vs_tcp``, ``ratio_vs_dask``, ``two_shards_ratio_vs_grpc`` and
``ratio_vs_grpc_prebuilt_push`` are reported, not targets.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

from _common import emit, machine, parser, setup_threads, source, versions
from ps_throughput_anchors import CALL_TIMEOUT_S, dask_anchor, grpc_anchor, spawned, tcp_anchor

MODEL_PARAMS = 25_000_000
TARGET_VS_GRPC = 0.8  # ps_gbps / grpc_gbps, at least
TARGET_CPU_RATIO = 1.5  # PS CPU-seconds per GB / bare gRPC's, at most
TARGET_VS_TCP = 0.6  # reported only: not part of target_met
GRPC_CHUNKS = (1 << 20, 2 << 20, 4 << 20)  # bare gRPC message sizes tried; the best counts


# ------------------------------------------------------------------ the model
def model_shapes() -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes of a 25M-parameter model: large matrices, medium ones, many small ones."""
    shapes: list[tuple[str, tuple[int, ...]]] = [
        ("fc/w", (2048, 2000)),  # 4.1M
        ("mixed_7c/w", (1536, 2048)),  # 3.1M
        ("mixed_7b/w", (1280, 2048)),  # 2.6M
        ("aux/w", (768, 2816)),  # 2.2M
    ]
    shapes += [(f"mixed_6{i}/w", (3, 3, 192, 320)) for i in range(18)]  # 18 x 0.55M
    shapes += [(f"conv{i}/w", (3, 3, 32, 64)) for i in range(120)]  # 120 x 18k
    shapes += [(f"conv{i}/b", (64,)) for i in range(120)]
    shapes += [(f"bn{i}/gamma", (320,)) for i in range(60)]
    used = sum(_count(s) for _, s in shapes)
    shapes.append(("logits/w", (MODEL_PARAMS - used,)))  # the rest (0.78M), so the total is exact
    return shapes


def _count(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def make_model(np: Any) -> dict[str, Any]:
    """The model's float32 values (fixed seed)."""
    rng = np.random.default_rng(0)
    return {name: rng.standard_normal(shape, dtype=np.float32) for name, shape in model_shapes()}


# ------------------------------------------------------------------ the parameter servers
@contextmanager
def ps_servers(count: int, token_dir: str) -> Iterator[tuple[list[str], str, list[int]]]:
    """``count`` ``cellgraph ps`` subprocesses on loopback: yield their addresses, the token and their pids."""
    from cellgraph.cluster.ps import new_token, write_token_file

    token = new_token()
    token_file = os.path.join(token_dir, "job.token")
    write_token_file(token_file, token)
    argv = [
        sys.executable,
        "-m",
        "cellgraph.cli",
        "ps",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--token-file",
        token_file,
    ]
    with ExitStack() as stack:
        addresses, pids = [], []
        for i in range(count):
            proc, line = stack.enter_context(spawned(argv, f"PS subprocess {i}"))
            pids.append(proc.pid)
            # "cellgraph ps: serving on HOST:PORT (...)"
            if "serving on " not in line:
                raise RuntimeError(f"PS subprocess {i} said {line!r}, not 'cellgraph ps: serving on HOST:PORT'")
            addresses.append(line.split("serving on ", 1)[1].split()[0])
        yield addresses, token, pids


# ------------------------------------------------------------------ CPU time of processes
def _pid_cpu_s(pid: int) -> float:
    """User + system CPU-seconds of ``pid`` so far (psutil if installed, else /proc/<pid>/stat); 0 if gone."""
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        try:
            t = psutil.Process(pid).cpu_times()
        except psutil.Error:
            return 0.0
        return t.user + t.system
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # Fields after the ')' start at field 3 (state): utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (psutil if installed, else /proc)."""
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        try:
            return [p.pid for p in psutil.Process(pid).children(recursive=True)]
        except psutil.Error:
            return []
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    out, frontier = [], [pid]
    while frontier:
        kids = [c for c, p in parents.items() if p in frontier]
        out += kids
        frontier = kids
    return out


def cpu_s(pids: Sequence[int]) -> float:
    """CPU-seconds so far of this process (all its threads) and of ``pids``."""
    return time.process_time() + sum(_pid_cpu_s(pid) for pid in pids)


# ------------------------------------------------------------------ timing
def time_turns(
    sides: dict[str, Callable[[], Any]], repeats: int, warmup: int, pids: dict[str, Sequence[int]]
) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Seconds of single calls, the sides taking turns (A B C, A B C, ...) so a slow spell hits all alike.

    Also the CPU-seconds each side spent over its timed calls: this process's
    plus those of the server processes ``pids[name]``.
    """
    for fn in sides.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in sides}
    cpu: dict[str, float] = dict.fromkeys(sides, 0.0)
    for _ in range(repeats):
        for name, fn in sides.items():
            cpu_start, start = cpu_s(pids[name]), time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
            cpu[name] += cpu_s(pids[name]) - cpu_start
    return times, cpu


def summary(times: list[float], nbytes: int) -> dict[str, float]:
    """GB/s (1e9 bytes) at the median and the best call, and the spread in seconds."""
    med = statistics.median(times)
    return {
        "gbps": nbytes / med / 1e9,
        "best_gbps": nbytes / min(times) / 1e9,
        "median_s": med,
        "min_s": min(times),
        "max_s": max(times),
    }


def both_ways(pull: list[float], push: list[float], nbytes: int) -> tuple[float, float]:
    """(median, best) of 2 x bytes / (pull + push seconds), pairing the calls of each turn."""
    rounds = [p + q for p, q in zip(pull, push)]
    return 2 * nbytes / statistics.median(rounds) / 1e9, 2 * nbytes / min(rounds) / 1e9


def main() -> None:
    args = parser(__doc__.splitlines()[0]).parse_args()
    setup_threads(args.threads)
    started = time.perf_counter()

    import numpy as np

    from cellgraph.cluster.ps import OptimizerConfig, ParameterClient, TrainingConfig

    repeats, warmup = (3, 1) if args.quick else (11, 2)
    model = make_model(np)
    arrays = list(model.values())
    model_bytes = sum(a.nbytes for a in arrays)
    grads = {name: np.full_like(value, 0.5) for name, value in model.items()}
    print(f"model: {len(model)} float32 variables, {MODEL_PARAMS:,} parameters, {model_bytes / 1e6:.0f} MB")

    with tempfile.TemporaryDirectory(prefix="cellgraph-ps-bench-") as tmp, ExitStack() as stack:
        # "ps": one shard, one server process, as the bare gRPC anchor has; "ps2": the model over two shards
        # (reported: on two cores, two servers and the client are three busy processes).
        ps: dict[str, Any] = {}
        for side, shards in (("ps", 1), ("ps2", 2)):
            os.makedirs(os.path.join(tmp, side))
            addresses, token, side_pids = stack.enter_context(ps_servers(shards, os.path.join(tmp, side)))
            client = stack.enter_context(ParameterClient(addresses, token, timeout=CALL_TIMEOUT_S))
            setup_start = time.perf_counter()
            client.init("bench", model, OptimizerConfig("sgd", learning_rate=0.0), TrainingConfig("async"))
            client.register(0)
            held = [
                sum(spec.nbytes for pieces in client.layout.values() for s, spec in pieces if s == i)  # type: ignore[union-attr]
                for i in range(shards)
            ]
            ps[side] = {"client": client, "pids": side_pids, "init_s": time.perf_counter() - setup_start}
            ps[side] |= {"shard_bytes": held, "out": {name: np.empty_like(value) for name, value in model.items()}}
            print(
                f"{side}: {shards} shard(s) at {', '.join(addresses)} hold"
                f" {' + '.join(f'{b / 1e6:.1f}' for b in held)} MB; init {ps[side]['init_s']:.2f} s"
            )
            pulled = client.pull().values
            bad = [name for name, value in model.items() if not np.array_equal(pulled[name], value)]
            if bad:
                raise SystemExit(
                    f"{side}: the PS returned different values for {len(bad)} variable(s), e.g. {bad[0]!r}"
                )
        tcp = stack.enter_context(tcp_anchor(arrays, np))
        bare = stack.enter_context(grpc_anchor(arrays, np))
        known = {os.getpid(), *ps["ps"]["pids"], *ps["ps2"]["pids"], tcp.pid, bare.pid}
        dask_push, dask_pull = stack.enter_context(dask_anchor(arrays))
        dask_pids = [pid for pid in _descendants(os.getpid()) if pid not in known]

        sides: dict[str, Callable[[], Any]] = {}
        pids: dict[str, Sequence[int]] = {}
        for side, held_ps in ps.items():  # pulls into reused buffers, as a replica's and the anchor's do
            c, out = held_ps["client"], held_ps["out"]
            sides[f"{side}_pull"] = lambda c=c, out=out: c.pull(out=out)
            sides[f"{side}_push"] = lambda c=c: c.push(grads, step=0, replica_id=0)
            pids[f"{side}_pull"] = pids[f"{side}_push"] = held_ps["pids"]
        sides |= {"tcp_pull": tcp.pull, "tcp_push": tcp.push}
        pids |= {"tcp_pull": [tcp.pid], "tcp_push": [tcp.pid]}
        for chunk in GRPC_CHUNKS:
            mib = chunk >> 20
            sides[f"grpc{mib}m_push"] = lambda c=chunk: bare.push(c)  # push first: pull sends what was pushed
            sides[f"grpc{mib}m_pull"] = lambda c=chunk: bare.pull(c)
            sides[f"grpc{mib}m_prebuilt_push"] = lambda c=chunk: bare.push_prebuilt(c)
            pids[f"grpc{mib}m_push"] = pids[f"grpc{mib}m_pull"] = pids[f"grpc{mib}m_prebuilt_push"] = [bare.pid]
        sides |= {"dask_push": dask_push, "dask_pull": dask_pull}  # scatter first: gather needs what it placed
        pids |= {"dask_push": dask_pids, "dask_pull": dask_pids}
        times, cpu = time_turns(sides, repeats, warmup, pids)
        bare.check()
        for side, held_ps in ps.items():
            after = held_ps["client"].pull().values
            if any(not np.array_equal(after[name], value) for name, value in model.items()):
                raise SystemExit(f"{side}: pushes with learning rate 0 changed the PS's values")

    stats = {name: summary(t, model_bytes) for name, t in times.items()}
    for name, s in stats.items():
        print(
            f"{name:>12}: {s['gbps']:6.3f} GB/s median, {s['best_gbps']:6.3f} best"
            f"  ({s['median_s'] * 1e3:7.1f} ms; min {s['min_s'] * 1e3:.1f}, max {s['max_s'] * 1e3:.1f}; {repeats} calls)"
        )
    sides_all = ("ps", "ps2", "tcp", *(f"grpc{c >> 20}m" for c in GRPC_CHUNKS), "dask")
    gbps = {side: both_ways(times[f"{side}_pull"], times[f"{side}_push"], model_bytes) for side in sides_all}
    # CPU-seconds of all the side's processes per GB moved (both directions, every timed call).
    gb_moved = 2 * model_bytes * repeats / 1e9
    cpu_per_gb = {side: (cpu[f"{side}_pull"] + cpu[f"{side}_push"]) / gb_moved for side in sides_all}
    grpc_by_chunk = {c: gbps[f"grpc{c >> 20}m"][0] for c in GRPC_CHUNKS}
    best_chunk = max(GRPC_CHUNKS, key=lambda c: grpc_by_chunk[c])
    best_grpc = f"grpc{best_chunk >> 20}m"
    gbps["grpc"], cpu_per_gb["grpc"] = gbps[best_grpc], cpu_per_gb[best_grpc]
    for side in sides_all:
        med, best = gbps[side]
        print(
            f"{side:>12}: {med:6.3f} GB/s both ways (2 x bytes / (pull + push s)), best {best:.3f};"
            f" {cpu_per_gb[side]:.3f} CPU-s/GB (all processes)"
        )
    ratio_grpc = gbps["ps"][0] / gbps["grpc"][0]
    ratio_tcp, ratio_dask = gbps["ps"][0] / gbps["tcp"][0], gbps["ps"][0] / gbps["dask"][0]
    ratio_two_shards = gbps["ps2"][0] / gbps["grpc"][0]
    # Reported: against bare gRPC whose push sends messages made before the timed calls (the best chunk of those).
    prebuilt = max(
        both_ways(times[f"grpc{c >> 20}m_pull"], times[f"grpc{c >> 20}m_prebuilt_push"], model_bytes)[0]
        for c in GRPC_CHUNKS
    )
    cpu_ratio = cpu_per_gb["ps"] / cpu_per_gb["grpc"]
    grpc_met, cpu_met = ratio_grpc >= TARGET_VS_GRPC, cpu_ratio <= TARGET_CPU_RATIO
    print(
        f"bare gRPC: best chunk {best_chunk >> 20} MiB;"
        f" ratio ps / grpc = {ratio_grpc:.3f} (target >= {TARGET_VS_GRPC}: {'met' if grpc_met else 'NOT met'});"
        f" CPU-s/GB ps / grpc = {cpu_ratio:.3f} (target <= {TARGET_CPU_RATIO}: {'met' if cpu_met else 'NOT met'})"
    )
    print(
        f"reported: ps / tcp = {ratio_tcp:.3f}; ps / dask = {ratio_dask:.2f}; two shards (ps2) / grpc ="
        f" {ratio_two_shards:.3f}, CPU-s/GB {cpu_per_gb['ps2'] / cpu_per_gb['grpc']:.3f}; ps / grpc with prebuilt"
        f" push messages = {gbps['ps'][0] / prebuilt:.3f}"
    )
    emit(
        {
            "benchmark": "ps_throughput",
            "ps_gbps": gbps["ps"][0],
            "ps_best_gbps": gbps["ps"][1],
            "ps_pull_gbps": stats["ps_pull"]["gbps"],
            "ps_push_gbps": stats["ps_push"]["gbps"],
            "grpc_gbps": gbps["grpc"][0],
            "grpc_best_gbps": gbps["grpc"][1],
            "grpc_pull_gbps": stats[f"{best_grpc}_pull"]["gbps"],
            "grpc_push_gbps": stats[f"{best_grpc}_push"]["gbps"],
            "grpc_chunk_bytes": best_chunk,
            "grpc_gbps_by_chunk": {str(c): v for c, v in grpc_by_chunk.items()},
            "tcp_gbps": gbps["tcp"][0],
            "tcp_best_gbps": gbps["tcp"][1],
            "tcp_pull_gbps": stats["tcp_pull"]["gbps"],
            "tcp_push_gbps": stats["tcp_push"]["gbps"],
            "dask_gbps": gbps["dask"][0],
            "dask_best_gbps": gbps["dask"][1],
            "dask_pull_gbps": stats["dask_pull"]["gbps"],
            "dask_push_gbps": stats["dask_push"]["gbps"],
            "ratio_vs_grpc": ratio_grpc,
            "ratio_vs_tcp": ratio_tcp,
            "grpc_prebuilt_push_gbps": prebuilt,
            "ratio_vs_grpc_prebuilt_push": gbps["ps"][0] / prebuilt,
            "two_shards_gbps": gbps["ps2"][0],
            "two_shards_ratio_vs_grpc": ratio_two_shards,
            "two_shards_cpu_s_per_gb_ratio_vs_grpc": cpu_per_gb["ps2"] / cpu_per_gb["grpc"],
            "ratio_vs_dask": ratio_dask,
            "cpu_s_per_gb": {side: cpu_per_gb[side] for side in ("ps", "ps2", "grpc", "tcp", "dask")},
            "cpu_s_per_gb_ratio_vs_grpc": cpu_ratio,
            "target_vs_grpc": TARGET_VS_GRPC,
            "target_vs_grpc_met": grpc_met,
            "target_cpu_ratio": TARGET_CPU_RATIO,
            "target_cpu_ratio_met": cpu_met,
            "target_vs_tcp": TARGET_VS_TCP,
            "target_met": grpc_met and cpu_met,
            "seconds": {name: {k: v for k, v in s.items() if k.endswith("_s")} for name, s in stats.items()},
            "model_bytes": model_bytes,
            "model_variables": len(model),
            "shards": 1,
            "shard_bytes": ps["ps"]["shard_bytes"],
            "two_shards_shard_bytes": ps["ps2"]["shard_bytes"],
            "gbps_definition": "GB/s = 1e9 bytes/s; *_gbps both ways = 2 * model_bytes / median(pull_s + push_s)",
            "cpu_definition": "cpu_s_per_gb = CPU-s (user + system) of this process and the side's servers"
            " over the timed pull and push calls / GB moved (2 * model_bytes * repeats / 1e9)",
            "init_s": ps["ps"]["init_s"],
            "quick": args.quick,
            "repeats": repeats,
            "warmup": warmup,
            "total_s": time.perf_counter() - started,
            "machine": machine(),
            "versions": versions(),
            "source": source(),
        }
    )


if __name__ == "__main__":
    main()
