"""The ``cellgraph`` command line: ``demo``, ``train``, ``ps``, ``install-kernel`` and ``export``.

Exit status: 0 done; 1 training failed or (with ``--check``) an accuracy
target was missed; 2 bad arguments, a missing extra or an unreachable
scheduler; 130 interrupted (Ctrl-C), after shutting the job down (and the cluster,
unless ``--scheduler`` named one someone else started).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NoReturn

from cellgraph import __version__
from cellgraph.dataflow.optimizer_registry import kinds

if TYPE_CHECKING:
    from cellgraph.examples.distributed import Settings

# Epochs per model that reach the single-process demo's accuracy targets in well under a minute.
LOCAL_EPOCHS = {"mlp": 40, "inception": 30, "resnet": 20, "inception_v3": 30, "transformer": 30, "lstm": 30}
TARGETS = {"mlp": 0.97, "inception": 0.98, "resnet": 0.97, "inception_v3": 0.97, "transformer": 0.97, "lstm": 0.97}
MODELS = sorted(LOCAL_EPOCHS)
LOCAL_DEFAULT = ["mlp", "inception"]  # what a plain ``demo --local`` trains: the two quickest
TRAINING_ROWS = 1438  # the digits split's training images (examples/digits.py), for checking --batch-size early


class _Parser(argparse.ArgumentParser):
    """Bad arguments give one line (the command, what is wrong, where to look) and exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _examples_missing(command: str) -> bool:
    try:
        import sklearn  # noqa: F401
        import tqdm  # noqa: F401
    except ImportError as err:
        print(
            f"{command} needs the examples extra ({err.name} is missing): pip install 'cellgraph[examples]'",
            file=sys.stderr,
        )
        return True
    return False


def _demo(args: argparse.Namespace) -> int:
    if _examples_missing("cellgraph demo"):
        return 2
    if args.model is not None and args.models is not None:
        args.parser.error("--model and --models both choose what to train: give one")
    if args.local:
        if args.batch_size is not None and args.batch_size > TRAINING_ROWS:
            args.parser.error(
                f"--batch-size {args.batch_size} is larger than the training set ({TRAINING_ROWS} images): "
                "no step would run"
            )
        return _demo_local(args)
    if args.batch_size is not None:
        args.parser.error(
            "--batch-size sets the single-process run's rows per step: add --local (cellgraph train --batch-size "
            "sets the cluster's)"
        )
    if args.models is not None or args.epochs is not None:
        args.parser.error(
            "--models and --epochs choose the single-process run: add --local "
            "(the distributed demo trains --model, the mini-Inception by default; cellgraph train takes options)"
        )
    from cellgraph.examples.distributed import Settings

    settings = Settings(model=args.model or "inception", progress=not args.no_progress)
    return _run_distributed("cellgraph demo", settings, args.check)


def _demo_local(args: argparse.Namespace) -> int:
    from cellgraph.examples import digits, models
    from cellgraph.examples.train import fit

    data = digits.load()
    print(f"digits: {len(data.x_train)} training and {len(data.x_test)} test images (8x8), fixed split, seed 0")
    failed = []
    for name in [args.model] if args.model else args.models or LOCAL_DEFAULT:
        model = models.MODELS[name]()
        epochs = args.epochs or LOCAL_EPOCHS[name]
        batch_size = args.batch_size or 64
        result = fit(model, data, epochs=epochs, batch_size=batch_size, progress=not args.no_progress)
        met = result.test_accuracy >= TARGETS[name]
        if not met:
            failed.append(name)
        print(
            f"{result.model}: test accuracy {result.test_accuracy:.2%} (target {TARGETS[name]:.0%}, "
            f"{'met' if met else 'NOT met'}); {result.samples_per_second:,.0f} samples/s over {result.steps} steps "
            f"in {result.train_seconds:.1f} s; first step (JIT compile or cache load) {result.first_step_seconds:.2f} s"
        )
    return 1 if failed and args.check else 0


def _train(args: argparse.Namespace) -> int:
    if _examples_missing("cellgraph train"):
        return 2
    from cellgraph.examples.distributed import Settings

    problem = _train_problem(args)
    if problem:
        args.parser.error(problem)
    settings = Settings(
        model=args.model, workers=args.workers or 2, ps=args.ps, mode=args.mode, steps=args.steps,
        batch_size=args.batch_size, replicas=args.replicas, replicas_to_aggregate=args.replicas_to_aggregate,
        optimizer=args.optimizer, lr=args.lr, checkpoint_dir=args.checkpoint_dir, scheduler=args.scheduler,
        progress=not args.no_progress, timeout_s=args.timeout,
    )  # fmt: skip
    return _run_distributed("cellgraph train", settings, args.check)


def _train_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with ``cellgraph train``'s arguments taken together, before anything starts."""
    if args.scheduler is not None and args.workers is not None:
        return "--workers starts local worker processes; with --scheduler the cluster's own workers train"
    workers = args.workers or 2
    replicas = args.replicas or (workers if args.scheduler is None else None)
    if args.scheduler is None and replicas is not None and replicas > workers:
        return f"--replicas {replicas} needs {replicas} training workers and --workers is {workers}: raise --workers"
    if args.checkpoint_dir is not None and args.scheduler is None:
        # The local cluster writes it on this machine: a bad path is found now, not after the cluster started.
        # (A --scheduler's workers may write it on other machines, where this one cannot look.)
        problem = folder_problem("--checkpoint-dir", args.checkpoint_dir)
        if problem:
            return problem
    k = args.replicas_to_aggregate
    if k is not None and args.mode != "sync":
        return "--replicas-to-aggregate is for --mode sync (async mode applies every gradient on arrival)"
    if k is not None and replicas is not None and k > replicas:
        return f"--replicas-to-aggregate {k} is more than the {replicas} replicas: at most --replicas"
    if replicas is not None and args.batch_size > TRAINING_ROWS // replicas:
        return (
            f"--batch-size {args.batch_size} is larger than a replica's shard ({TRAINING_ROWS // replicas} rows: "
            f"{TRAINING_ROWS} training images over {replicas} replicas)"
        )
    return None


def folder_problem(flag: str, path: str) -> str | None:
    """Why ``path`` cannot be a folder this process writes into (made, with its parents, if missing), or None."""
    target = os.path.abspath(path)
    if os.path.exists(target) and not os.path.isdir(target):
        return f"{flag} {path} is a file, not a folder: give a folder (it is made if missing)"
    existing = target
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        return f"{flag} {path} cannot be made: {existing} is a file, not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{flag} {path} is not writable: this user cannot write into {existing}"
    return None


def _run_distributed(command: str, settings: Settings, check: bool) -> int:
    from cellgraph.dataflow.errors import CellgraphError
    from cellgraph.examples.distributed import SetupError, run

    try:
        outcome = run(settings)
    except KeyboardInterrupt:
        closed = (
            "the job and the cluster are shut down"
            if settings.scheduler is None
            else f"the job is closed; the cluster at {settings.scheduler} is left running (this command did not "
            "start it)"
        )
        print(f"{command}: interrupted; {closed}", file=sys.stderr)
        return 130
    except SetupError as err:
        print(f"{command}: error: {err}", file=sys.stderr)
        return 2
    except CellgraphError as err:
        print(f"{command}: training failed: {err}", file=sys.stderr)
        return 1
    return 1 if check and not outcome.met else 0


def _positive(kind: type[int] | type[float]) -> Callable[[str], int | float]:
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__}, got {text!r}") from None
        if not (math.isfinite(value) and value > 0):  # nan and inf parse as floats: refused here, not in a traceback
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__}, got {text!r}")
        return value

    parse.__name__ = f"positive {kind.__name__}"
    return parse


def _scheduler_address(text: str) -> str:
    from distributed.comm import get_address_host_port

    try:
        get_address_host_port(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{text!r} is not a scheduler address ({err}): give tcp://host:8786") from None
    return text


def _add_demo(commands: argparse._SubParsersAction) -> None:
    demo = commands.add_parser(
        "demo",
        help="train the mini-Inception on the digits on a local Dask cluster (1 PS, 2 workers), print test accuracy",
    )
    demo.add_argument(
        "--local", action="store_true", help="train in this process instead (MLP and mini-Inception, or --model)"
    )
    demo.add_argument(
        "--model", choices=MODELS, default=None, help="the model to train (default: the mini-Inception on the cluster)"
    )
    demo.add_argument("--models", nargs="+", choices=MODELS, default=None, help="with --local: models to train")
    # Positive, as cellgraph train's: --batch-size 0 ended in a traceback, and a negative one or one above the
    # training rows (or --epochs -1) trained 0 (or -22) steps and printed a test accuracy as if it had trained.
    positive_int = _positive(int)
    demo.add_argument(
        "--epochs", type=positive_int, default=None, help="with --local: epochs per model (default: per model)"
    )
    demo.add_argument("--batch-size", type=positive_int, default=None, help="with --local: rows per step (default 64)")
    demo.add_argument("--no-progress", action="store_true", help="no progress bar")
    demo.add_argument("--check", action="store_true", help="exit 1 when an accuracy target is missed")
    demo.set_defaults(run=_demo, parser=demo)


def _add_train(commands: argparse._SubParsersAction) -> None:
    positive_int, positive_float = _positive(int), _positive(float)
    train = commands.add_parser("train", help="train a digits model on a Dask cluster (local, or --scheduler)")
    train.add_argument("--model", choices=MODELS, default="inception")
    train.add_argument("--workers", type=positive_int, default=None, help="local training workers (default 2)")
    train.add_argument("--ps", type=positive_int, default=1, help="parameter-server workers (default 1)")
    train.add_argument("--mode", choices=["sync", "async"], default="sync")
    train.add_argument("--steps", type=positive_int, default=None, help="global steps (default: per model)")
    train.add_argument("--batch-size", type=positive_int, default=64, help="rows per replica per step")
    train.add_argument("--replicas", type=positive_int, default=None, help="default: one per training worker")
    train.add_argument(
        "--replicas-to-aggregate", type=positive_int, default=None, help="sync: gradients per step (default: all)"
    )
    train.add_argument("--optimizer", choices=kinds(), default="adam", help="the optimizer's kind (default adam)")
    train.add_argument(
        "--lr", type=positive_float, default=None, help="learning rate (default: per model for adam, else the kind's)"
    )
    train.add_argument("--checkpoint-dir", default=None, help="default: a new temporary folder")
    train.add_argument("--scheduler", type=_scheduler_address, default=None, help="tcp://host:port of a Dask scheduler")
    train.add_argument("--timeout", type=positive_float, default=600.0, help="seconds before the job is stopped")
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    train.add_argument("--check", action="store_true", help="exit 1 when the accuracy target is missed")
    train.set_defaults(run=_train, parser=train)


def _install_kernel(args: argparse.Namespace) -> int:
    from cellgraph.kernel_ext.kernelspec import KernelspecError, install

    try:
        path = install(args.name, args.display_name, user=args.user, prefix=args.prefix)
    except KernelspecError as err:
        args.parser.error(str(err))
    except OSError as err:
        print(
            f"cellgraph install-kernel: error: could not write the kernelspec ({err}): "
            "use --user to install for yourself, or --prefix for another folder",
            file=sys.stderr,
        )
        return 2
    print(f"installed kernelspec {args.name!r} ({args.display_name}) in {path}: its kernels load cellgraph at start")
    return 0


def _add_install_kernel(commands: argparse._SubParsersAction) -> None:
    from cellgraph.kernel_ext.kernelspec import DEFAULT_DISPLAY_NAME, DEFAULT_NAME

    install = commands.add_parser(
        "install-kernel",
        help=f"install a Jupyter kernel, {DEFAULT_DISPLAY_NAME!r}, that loads the cellgraph extension at start",
    )
    install.add_argument("--user", action="store_true", help="install for this user only (~/.local/share/jupyter)")
    install.add_argument("--name", default=DEFAULT_NAME, help=f"the kernelspec's name (default {DEFAULT_NAME})")
    install.add_argument("--display-name", default=DEFAULT_DISPLAY_NAME, help="the name the notebook shows")
    install.add_argument("--prefix", default=None, help="install under PREFIX/share/jupyter/kernels (e.g. a venv)")
    install.set_defaults(run=_install_kernel, parser=install)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _Parser(prog="cellgraph", description="Distributed machine learning from a notebook.")
    parser.add_argument("--version", action="version", version=f"cellgraph {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    _add_demo(commands)
    _add_train(commands)
    from cellgraph.cluster.ps import command as ps_command

    ps_command.add_parser(commands)
    _add_install_kernel(commands)
    from cellgraph import export_command

    export_command.add_parser(commands)
    args = parser.parse_args(argv)
    run: Callable[[argparse.Namespace], int] = args.run
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
