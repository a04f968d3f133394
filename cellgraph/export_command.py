"""``cellgraph export``: a trained example model, from a job's checkpoint folder, as a saved model or ONNX.

Exit status: 0 written; 1 the checkpoint cannot be exported (named in the
message); 2 bad arguments or the onnx extra missing.

Examples
--------
>>> import argparse
>>> commands = argparse.ArgumentParser(prog="cellgraph").add_subparsers()
>>> add_parser(commands)
>>> argv = ["--checkpoint", "ckpt", "--model", "mlp", "--format", "onnx", "-o", "m.onnx"]
>>> args = commands.choices["export"].parse_args(argv)
>>> args.format, args.opset
('onnx', 17)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

FORMATS = ("onnx", "saved")


def add_parser(commands: argparse._SubParsersAction) -> None:
    from cellgraph.examples.models import MODELS
    from cellgraph.onnx.common import MAX_OPSET, MIN_OPSET

    export = commands.add_parser(
        "export",
        help="write a digits model trained by `cellgraph train` (its checkpoint folder) as ONNX or a saved model",
    )
    export.add_argument("--checkpoint", required=True, help="the job's checkpoint folder (its newest checkpoint)")
    export.add_argument("--model", required=True, choices=sorted(MODELS), help="the model the job trained")
    export.add_argument("--format", required=True, choices=FORMATS, help="onnx: one .onnx file; saved: a folder")
    export.add_argument("-o", "--output", required=True, help="the file (onnx) or folder (saved) to write")
    # A choice, so that an opset it does not write is a bad argument (exit 2), not a failed export (exit 1).
    opsets = range(MIN_OPSET, MAX_OPSET + 1)
    export.add_argument(
        "--opset", type=int, choices=opsets, default=MIN_OPSET, metavar=f"{{{MIN_OPSET}..{MAX_OPSET}}}",
        help=f"with --format onnx: the ONNX opset ({MIN_OPSET} to {MAX_OPSET})",
    )  # fmt: skip
    export.set_defaults(run=run, parser=export)


def run(args: argparse.Namespace) -> int:
    from cellgraph.examples.models import MODELS
    from cellgraph.inference import ExportError

    model = MODELS[args.model]()
    output = Path(args.output)
    try:
        if args.format == "onnx":
            import cellgraph.onnx as cg_onnx

            cg_onnx.export(output, model.x, model.logits, Path(args.checkpoint), opset=args.opset)
        else:
            from cellgraph.saved_model import save_model

            save_model(output, model.x, model.logits, Path(args.checkpoint))
    except ExportError as err:
        print(f"cellgraph export: error: {err}", file=sys.stderr)
        # A missing extra is a setup problem, like bad arguments; anything else is the checkpoint's.
        return 2 if "the onnx extra" in str(err) else 1
    kind = "ONNX model" if args.format == "onnx" else "saved model"
    print(f"wrote the {kind} of {args.model} ({model.x.name} -> {model.logits.name}) to {output}")
    return 0
