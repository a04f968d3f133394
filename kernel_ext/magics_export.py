"""``%export OUTPUTS --inputs X --format onnx|saved -o PATH``: the current job's model out of the notebook.

A PATH ending in ``.onnx`` needs no ``--format``: it is written as ONNX.

The values come from ``--checkpoint DIR`` (a job's checkpoint folder), or
``--from NAME`` (a ``Session``, a ``Job`` or a dict of arrays in the notebook),
or else the current job (``job``, as ``%train`` binds it). ``--model NAME``
exports an example model (``cellgraph.examples.models``) instead of OUTPUTS,
as ``cellgraph export`` does.

Examples
--------
>>> print(ExportMagics.export.parser.format_usage().strip())
usage: %export [-h] [--inputs X[,X2]] [--model MODEL] [--format {onnx,saved}] [-o PATH]
               [--checkpoint DIR] [--from NAME] [--opset OPSET]
               [OUTPUTS]
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, kwds, magic_arguments

from cellgraph.dataflow.errors import CellgraphError
from cellgraph.dataflow.graph import Tensor

from .arguments import MagicFormatter, lookup, parse, usage_error

if TYPE_CHECKING:
    import argparse

    from .extension import Extension

NO_SOURCE = (
    "no values to export: give --checkpoint DIR (a job's checkpoint folder), --from NAME (a Session, Job or dict), "
    "or run %train first (its job is bound to `job`)"
)


@magics_class
class ExportMagics(Magics):
    """``%export``."""

    def __init__(self, shell: Any, ext: Extension) -> None:
        super().__init__(shell)
        self.ext = ext

    @magic_arguments()
    @kwds(formatter_class=MagicFormatter)
    @argument("-h", "--help", action="store_true", help="show this help and do nothing")
    @argument("--inputs", metavar="X[,X2]", default=None, help="the placeholders that feed OUTPUTS, by name")
    @argument(
        "--model", default=None, help="an example model (mlp, inception, resnet, ...) instead of OUTPUTS and --inputs"
    )
    @argument(
        "--format",
        choices=["onnx", "saved"],
        required=False,
        default=None,
        help="onnx: one file (the default for a .onnx PATH); saved: a folder",
    )
    @argument("-o", "--output", default=None, metavar="PATH", help="the file (onnx) or folder (saved) to write")
    @argument("--checkpoint", default=None, metavar="DIR", help="values from a job's checkpoint folder")
    @argument("--from", dest="source", default=None, metavar="NAME", help="values from a Session, Job or dict")
    @argument("--opset", type=int, default=17, help="with --format onnx: the ONNX opset (17 to 21)")
    @argument("outputs", nargs="?", metavar="OUTPUTS", help="the tensors to export, by name (logits or model.logits)")
    @line_magic
    def export(self, line: str) -> None:
        """Write OUTPUTS (fed by --inputs) with trained values as ONNX or a cellgraph saved model.

        Names are looked up in the notebook; nothing is evaluated.
        Example: %export model.logits --inputs model.x --format onnx -o model.onnx
        """
        args = parse(self.export, line)
        if args is None:
            return
        inputs, outputs = self._tensors(args)
        source = self._source(args)
        output = Path(args.output)
        try:
            if args.format == "onnx":
                from cellgraph import onnx as cg_onnx

                cg_onnx.export(output, inputs, outputs, source, opset=args.opset)
            else:
                from cellgraph.saved_model import save_model

                save_model(output, inputs, outputs, source)
        except CellgraphError as err:
            raise UsageError(f"%export: {err}") from None
        kind = "ONNX model" if args.format == "onnx" else "saved model"
        names = f"{', '.join(t.name for t in inputs)} -> {', '.join(t.name for t in outputs)}"
        print(f"wrote the {kind} ({names}) to {output}")

    def _tensors(self, args: argparse.Namespace) -> tuple[list[Tensor], list[Tensor]]:
        if args.output is None:
            raise usage_error(self.export, "-o PATH is needed: the .onnx file or the saved model's folder to write")
        if args.format is None:
            if Path(args.output).suffix.lower() != ".onnx":
                raise usage_error(
                    self.export,
                    f"--format is needed (onnx or saved): -o {args.output!r} does not end in .onnx, "
                    "where onnx is taken as the format",
                )
            args.format = "onnx"
        if args.model is not None:
            from cellgraph.examples.models import MODELS

            if args.outputs is not None or args.inputs is not None:
                raise usage_error(self.export, "--model exports that model's logits: leave OUTPUTS and --inputs out")
            if args.model not in MODELS:
                raise usage_error(self.export, f"--model {args.model!r} is not one of {', '.join(sorted(MODELS))}")
            model = MODELS[args.model]()
            return [model.x], [model.logits]
        if args.outputs is None or args.inputs is None:
            raise usage_error(self.export, "name OUTPUTS and --inputs (or --model NAME for an example model)")
        assert self.shell is not None
        found = []
        for text, what in ((args.inputs, "--inputs"), (args.outputs, "OUTPUTS")):
            tensors = []
            for name in (n.strip() for n in text.split(",")):
                try:
                    value = lookup(self.shell.user_ns, name, what)
                except LookupError as err:
                    raise usage_error(self.export, str(err)) from None
                if not isinstance(value, Tensor):
                    raise usage_error(self.export, f"{what} {name!r} is a {type(value).__name__}, not a cg.Tensor")
                tensors.append(value)
            found.append(tensors)
        return found[0], found[1]

    def _source(self, args: argparse.Namespace) -> Any:
        if args.checkpoint is not None and args.source is not None:
            raise usage_error(self.export, "give --checkpoint or --from, not both")
        if args.checkpoint is not None:
            return Path(args.checkpoint)
        assert self.shell is not None
        if args.source is not None:
            try:
                return lookup(self.shell.user_ns, args.source, "--from")
            except LookupError as err:
                raise usage_error(self.export, str(err)) from None
        job = self.shell.user_ns.get("job")
        if job is None and self.ext.jobs:
            job = self.ext.jobs[-1]
        if job is None:
            raise usage_error(self.export, NO_SOURCE)
        return job
