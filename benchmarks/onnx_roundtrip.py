"""Models out and in: the example models through a saved model, ONNX Runtime and ONNX import.

Each example model (mlp, mini-Inception, ResNet, Inception-v3, Transformer,
LSTM) is trained a few Adam steps on the digits, then its logits on the test
set are computed four ways: the training session (in inference mode, a
training switch fed False); ``cg.load_model`` in a new Python process; ONNX
Runtime on ``cg.onnx.export``'s file; and ``cg.onnx.import_model`` of that file. The
largest absolute difference from the session over all of them is
``max_abs_diff`` (target <= 1e-4, float32), and every way must predict the same
classes. Batches of 1 and 37 rows check that the batch dimension is dynamic.
The inference time per test-set batch is reported for the session and ONNX
Runtime (one thread each). Then ONNX's own node conformance cases of every ONNX
op cellgraph imports run through ``import_model``: ``conformance_pass_rate`` is
passed / all cases of those ops, and ``conformance_min_op_pass_rate`` the lowest
of the ops' own rates (target >= 0.85 for every op: ``conformance_ops_below``
lists any below it); beside them, the rate without
the cases that pass computed in a wider type (uint16 as int32, float8 read as
float16: ``conformance_pass_rate_strict``), over the cases not refused for
their dtype, and how many passes are random draws (Dropout in training mode)
checked against the op's definition (``conformance_random``).

    python benchmarks/onnx_roundtrip.py [--quick] [--threads N]
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import emit, machine, parser, setup_threads, source, versions

TARGET_DIFF = 1e-4
MODELS = ("mlp", "inception", "resnet", "inception_v3", "transformer", "lstm")
TARGET_PASS_RATE = 0.85
LOADER = """
import sys
import numpy as np
import cellgraph as cg
model = cg.load_model(sys.argv[1])
x = np.load(sys.argv[2])
np.savez(sys.argv[3], full=model(x), one=model(x[:1]), batch37=model(x[:37]))
"""


def _median_ms(fn: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2] * 1e3


def _one_model(name: str, steps: int, repeats: int, folder: Path) -> dict[str, Any]:
    import numpy as np
    import onnxruntime as ort

    import cellgraph as cg
    from cellgraph.examples import digits, models

    data = digits.load()
    model = models.MODELS[name]()
    session = cg.Session(model.graph)
    x_train = data.images(data.x_train) if model.image_input else data.x_train
    x = data.images(data.x_test) if model.image_input else data.x_test
    for i in range(steps):
        rows = slice((i * 64) % 1344, (i * 64) % 1344 + 64)
        session.run(model.train_op, {model.x: x_train[rows], model.y: data.y_train[rows]})
    switch = {model.training: False} if model.training is not None else {}
    want = {
        k: session.run(model.logits, {model.x: x[:n], **switch})
        for k, n in (("full", len(x)), ("one", 1), ("batch37", 37))
    }

    saved = cg.save_model(folder / f"{name}-saved", model.x, model.logits, session)
    np.save(folder / "x.npy", x)
    subprocess.run([sys.executable, "-c", LOADER, str(saved), str(folder / "x.npy"), str(folder / "out.npz")],
                   check=True, timeout=600)  # fmt: skip
    loaded = dict(np.load(folder / "out.npz"))

    path = folder / f"{name}.onnx"
    cg.onnx.export(path, model.x, model.logits, session)
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    runtime = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    onnx_out = {k: runtime.run(None, {"x": x[: len(v)]})[0] for k, v in want.items()}
    imported = cg.onnx.import_model(path)
    imported_out = {k: imported(x[: len(v)]) for k, v in want.items()}

    diffs, same = {}, True
    for way, outs in (("saved_new_process", loaded), ("onnxruntime", onnx_out), ("onnx_import", imported_out)):
        diffs[way] = max(float(np.abs(outs[k] - want[k]).max()) for k in want)
        same = same and all((outs[k].argmax(1) == want[k].argmax(1)).all() for k in want)
    run_session = session.make_callable([model.logits], [model.x, *switch])
    off = [np.array(False)] * len(switch)
    return {
        "model": name,
        "max_abs_diff": max(diffs.values()),
        "diffs": diffs,
        "predictions_identical": bool(same),
        "cellgraph_ms": _median_ms(lambda: run_session(x, *off), repeats),
        "onnxruntime_ms": _median_ms(lambda: runtime.run(None, {"x": x}), repeats),
        "test_rows": len(x),
        "train_steps": steps,
    }


def main() -> None:
    args = parser(__doc__.splitlines()[0]).parse_args()
    setup_threads(args.threads)
    started = time.perf_counter()
    steps, repeats = (5, 5) if args.quick else (200, 30)
    with tempfile.TemporaryDirectory() as tmp:
        results = [_one_model(name, steps, repeats, Path(tmp)) for name in MODELS]
    for r in results:
        print(
            f"{r['model']}: max |diff| {r['max_abs_diff']:.2e} (saved in a new process "
            f"{r['diffs']['saved_new_process']:.1e}, ONNX Runtime {r['diffs']['onnxruntime']:.1e}, "
            f"imported {r['diffs']['onnx_import']:.1e}); predictions identical: {r['predictions_identical']}; "
            f"{r['test_rows']} rows: session {r['cellgraph_ms']:.2f} ms, ONNX Runtime {r['onnxruntime_ms']:.2f} ms"
        )

    from cellgraph.onnx import conformance

    results_by_op = conformance.run()
    rate = conformance.pass_rate(results_by_op)
    strict = conformance.pass_rate(results_by_op, widened=False)
    widened = sum(len(r.widened) for r in results_by_op.values())
    random = sum(len(r.random) for r in results_by_op.values())
    cases = sum(r.total for r in results_by_op.values())
    in_dtypes = cases - sum(conformance.dtype_refusals(r) for r in results_by_op.values())
    passed = sum(len(r.passed) for r in results_by_op.values())
    failed = sum(len(r.failed) for r in results_by_op.values())
    print(conformance.markdown_table(results_by_op))
    min_op_rate = min(r.pass_rate for r in results_by_op.values())
    below = sorted(op for op, r in results_by_op.items() if r.pass_rate < TARGET_PASS_RATE)
    max_diff = max(r["max_abs_diff"] for r in results)
    print(
        f"max |diff| {max_diff:.2e} (target <= {TARGET_DIFF}: {'met' if max_diff <= TARGET_DIFF else 'NOT met'}); "
        f"conformance: {passed} of {cases} cases of {len(results_by_op)} ops pass = {rate:.1%} "
        f"(target >= {TARGET_PASS_RATE:.0%}: {'met' if rate >= TARGET_PASS_RATE else 'NOT met'}); "
        f"lowest op {min_op_rate:.1%} (every op >= {TARGET_PASS_RATE:.0%}: "
        f"{'met' if not below else 'NOT met, ' + ', '.join(below)}), "
        f"{widened} of them computed in a wider type; {strict:.1%} without those; {random} random draws "
        "checked against the op's definition; "
        f"{passed} of {in_dtypes} not refused for their dtype = {passed / in_dtypes:.1%}; {failed} wrong answers"
    )
    emit(
        {
            "benchmark": "onnx_roundtrip",
            "models": [r["model"] for r in results],
            "max_abs_diff": max_diff,
            "max_abs_diff_target_met": max_diff <= TARGET_DIFF,
            "predictions_identical": all(r["predictions_identical"] for r in results),
            "per_model": results,
            "cellgraph_ms": max(r["cellgraph_ms"] for r in results),
            "onnxruntime_ms": max(r["onnxruntime_ms"] for r in results),
            "conformance_pass_rate": rate,
            "conformance_pass_rate_target_met": rate >= TARGET_PASS_RATE and not below,
            "conformance_min_op_pass_rate": min_op_rate,
            "conformance_ops_below": below,
            "conformance_pass_rate_cellgraph_dtypes": passed / in_dtypes,
            "conformance_pass_rate_strict": strict,
            "conformance_widened": widened,
            "conformance_random": random,
            "conformance_cases": cases,
            "conformance_ops": len(results_by_op),
            "conformance_failed": failed,
            "threads": args.threads,
            "quick": args.quick,
            "total_s": time.perf_counter() - started,
            "machine": machine(),
            "versions": versions(),
            "source": source(),
        }
    )


if __name__ == "__main__":
    main()
