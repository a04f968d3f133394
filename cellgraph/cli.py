"""The ``cellgraph`` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from cellgraph import __version__

# Epochs per model that reach the demo's accuracy targets in well under a minute.
DEMO_EPOCHS = {"mlp": 40, "inception": 30}
TARGETS = {"mlp": 0.97, "inception": 0.98}


def _demo(args: argparse.Namespace) -> int:
    try:
        import sklearn  # noqa: F401
        import tqdm  # noqa: F401
    except ImportError as err:
        print(
            f"cellgraph demo needs the examples extra ({err.name} is missing): pip install 'cellgraph[examples]'",
            file=sys.stderr,
        )
        return 2
    from cellgraph.examples import digits, models
    from cellgraph.examples.train import fit

    data = digits.load()
    print(f"digits: {len(data.x_train)} training and {len(data.x_test)} test images (8x8), fixed split, seed 0")
    failed = []
    for name in args.models:
        model = models.MODELS[name]()
        epochs = args.epochs or DEMO_EPOCHS[name]
        result = fit(model, data, epochs=epochs, batch_size=args.batch_size, progress=not args.no_progress)
        met = result.test_accuracy >= TARGETS[name]
        if not met:
            failed.append(name)
        print(
            f"{result.model}: test accuracy {result.test_accuracy:.2%} (target {TARGETS[name]:.0%}, "
            f"{'met' if met else 'NOT met'}); {result.samples_per_second:,.0f} samples/s over {result.steps} steps "
            f"in {result.train_seconds:.1f} s; first step (JIT compile or cache load) {result.first_step_seconds:.2f} s"
        )
    return 1 if failed and args.check else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cellgraph", description="Distributed machine learning from a notebook.")
    parser.add_argument("--version", action="version", version=f"cellgraph {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="train the digits MLP and mini-Inception, print test accuracy")
    demo.add_argument("--models", nargs="+", choices=sorted(DEMO_EPOCHS), default=["mlp", "inception"])
    demo.add_argument("--epochs", type=int, default=None, help="epochs per model (default: per-model)")
    demo.add_argument("--batch-size", type=int, default=64)
    demo.add_argument("--no-progress", action="store_true", help="no progress bar")
    demo.add_argument("--check", action="store_true", help="exit 1 when an accuracy target is missed")
    demo.set_defaults(run=_demo)
    from cellgraph.cluster.ps import command as ps_command

    ps_command.add_parser(commands)
    args = parser.parse_args(argv)
    run: Callable[[argparse.Namespace], int] = args.run
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
