"""``%train LOSS [--replicas N --steps S --mode sync|async --optimizer adam:1e-3 --batch-size B --data X,y ...]``,
and the optimizer's settings (``--momentum 0.95 --nesterov``, ``--weight-decay 0.1 --amsgrad``)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, kwds, magic_arguments

from cellgraph.dataflow.errors import CellgraphError
from cellgraph.dataflow.graph import Tensor
from cellgraph.dataflow.optimizers import Optimizer

from .arguments import (
    NO_CLUSTER,
    OPTIMIZER_SETTINGS,
    OPTIMIZERS,
    MagicFormatter,
    ask_cluster,
    count,
    lookup,
    optimizer,
    optimizer_arguments,
    parse,
    positive_int,
    usage_error,
)
from .display import show_as

if TYPE_CHECKING:
    import argparse

    from cellgraph.cluster.cluster import Cluster

    from .extension import Extension


@magics_class
class TrainMagics(Magics):
    """``%train``."""

    def __init__(self, shell: Any, ext: Extension) -> None:
        super().__init__(shell)
        self.ext = ext

    @magic_arguments()
    @kwds(formatter_class=MagicFormatter)
    @argument("-h", "--help", action="store_true", help="show this help and do nothing")
    @argument("--data", metavar="X,y", help="the training arrays, one per placeholder the loss needs, by name")
    @argument("--replicas", type=positive_int, default=None, help="default: one per training worker")
    @argument("--steps", type=count, default=1000, help="global steps (default 1000)")
    @argument("--mode", choices=["sync", "async"], default="sync", help="default sync")
    @argument(
        "--optimizer",
        default="adam:1e-3",
        metavar="NAME:RATE",
        help=f"{', '.join(sorted(OPTIMIZERS))}; default adam:1e-3",
    )
    @argument("--batch-size", type=positive_int, default=64, help="rows per replica per step (default 64)")
    @argument(
        "--replicas-to-aggregate", type=positive_int, default=None, help="sync: gradients per step (default: all)"
    )
    @argument("--max-staleness", type=count, default=None, help="async: how many versions a gradient may lag")
    @argument(
        "--checkpoint-every", type=positive_int, default=100, help="global steps between checkpoints (default 100)"
    )
    @argument("--checkpoint-dir", default=None, help="default: a new temporary folder")
    @argument(
        "--resume-from",
        metavar="DIR",
        default=None,
        help="start from a checkpoint: its folder (DIR/ckpt-0000000300), or a job's checkpoint_dir for the latest "
        "there; the job checkpoints on into that DIR",
    )
    @argument("--no-show", action="store_true", help="do not display the training monitor")
    @argument("loss", metavar="LOSS", help="the loss tensor, by name (loss, or model.loss)")
    @optimizer_arguments
    @line_magic
    def train(self, line: str) -> None:
        """Launch cg.train(LOSS, ...) on the current cluster, bind the job to `job`, show its monitor, and return at once.

        Names (LOSS, and each of --data) are looked up in the notebook; nothing is evaluated.
        Example: %train model.loss --data x_train,y_train --steps 300 --optimizer adam:1e-2
        The optimizer's other settings are flags: --optimizer momentum:0.1 --momentum 0.95 --nesterov.
        Then: job.wait(), job.stop(), job.variables().
        """
        args = parse(self.train, line)
        if args is None:
            return
        loss, data, opt = self._resolve(args)
        if args.max_staleness is not None and args.mode == "sync":  # cg.train would ignore it without a word
            raise usage_error(
                self.train,
                "--max-staleness bounds how stale an applied gradient may be in --mode async; a sync step drops "
                "every late gradient anyway: add --mode async, or leave --max-staleness out",
            )
        cluster = self.ext.current_cluster()
        if cluster is None:
            raise UsageError(f"%train: {NO_CLUSTER}")  # the arguments are fine: no usage
        for running in self.ext.jobs:
            if running.cluster is cluster and running.status in ("starting", "running"):
                # Re-running its cell cleared the job's monitor from the cell: it is shown again, and the
                # refusal is about the job, not the arguments (no usage).
                if not args.no_show:
                    show_as("training_monitor", "TrainingMonitor", running)
                raise UsageError(
                    f"%train: job {running.job_id} is still {running.status} on this cluster: job.stop() (or "
                    "job.close()) first"
                )
        checkpoint_dir, resume_from = args.checkpoint_dir, None
        if args.resume_from is not None:
            try:
                checkpoint_dir, resume_from = resume_point(args.resume_from, len(cluster.ps_workers()))
            except ValueError as err:
                raise usage_error(self.train, str(err)) from None
            if args.checkpoint_dir is not None and Path(args.checkpoint_dir).resolve() != checkpoint_dir.resolve():
                raise usage_error(
                    self.train,
                    f"--resume-from {args.resume_from!r} is a checkpoint of {str(checkpoint_dir)!r}, and "
                    f"--checkpoint-dir says {args.checkpoint_dir!r}: a resumed job checkpoints on into the folder it "
                    "resumes from; leave --checkpoint-dir out",
                )
        from cellgraph.cluster.job import train

        workers = len(ask_cluster("%train", cluster, cluster.training_workers))
        if not workers:  # its workers died or left, or none started yet: say so, not "pass replicas=0"
            raise usage_error(self.train, _no_training_workers(cluster))
        if args.replicas is not None and args.replicas > workers:  # in the magic's words, not cg.train's keywords
            raise usage_error(self.train, _too_few_workers(cluster, args.replicas, workers))
        replicas = args.replicas or workers
        try:
            job = train(
                loss, data, cluster=cluster, optimizer=opt, mode=args.mode, steps=args.steps,
                replicas=replicas, batch_size=args.batch_size,
                replicas_to_aggregate=args.replicas_to_aggregate, max_staleness=args.max_staleness,
                checkpoint_every=args.checkpoint_every, checkpoint_dir=checkpoint_dir, resume_from=resume_from,
            )  # fmt: skip
        except CellgraphError as err:  # cg.train checks everything it can before it starts anything
            raise UsageError(f"%train: {in_flags(str(err))}") from None
        self.ext.jobs.append(job)
        assert self.shell is not None
        self.shell.user_ns["job"] = job
        if not args.no_show:
            show_as("training_monitor", "TrainingMonitor", job)

    def _resolve(self, args: argparse.Namespace) -> tuple[Tensor, Any, Optimizer]:
        """The loss tensor, the data and the optimizer the arguments name; a ``UsageError`` for the first one wrong."""
        assert self.shell is not None
        ns = self.shell.user_ns
        try:
            loss = lookup(ns, args.loss, "LOSS")
            if args.data is None:
                raise LookupError("--data is missing: name the training arrays, e.g. --data x_train,y_train")
            if CODE.search(args.data):  # x_train[:, :10] split at its comma: say what is wrong with the whole
                raise LookupError(
                    f"--data {args.data!r} is code, not names: %train looks the arrays up by name and evaluates "
                    "nothing; bind them to names in a cell first (x_part = x_train[:100]), then --data x_part,..."
                )
            names = [name.strip() for name in args.data.split(",")]
            if "" in names:  # --data x_train, (a space after the comma ended the word)
                raise LookupError(f"--data {args.data!r} has an empty name: write the names without spaces, e.g. "
                                  "--data x_train,y_train")  # fmt: skip
            values = [lookup(ns, name, "--data") for name in names]
            for name, value in zip(names, values):
                _refuse_a_holder_of_arrays(name, value)
            opt = optimizer(args.optimizer, {name: getattr(args, name) for name in OPTIMIZER_SETTINGS})
        except (LookupError, ValueError) as err:
            raise usage_error(self.train, str(err)) from None
        if not isinstance(loss, Tensor):
            raise usage_error(self.train, f"LOSS {args.loss!r} is a {type(loss).__name__}, not a cg.Tensor")
        # One name may hold all the data: a tuple of arrays, or a dict {placeholder: array}.
        data = values[0] if len(values) == 1 and isinstance(values[0], tuple | dict) else tuple(values)
        return loss, data, opt


CODE = re.compile(r"[][(){}+*/=]")  # what a list of names and attribute paths never holds, and code often does


def _refuse_a_holder_of_arrays(name: str, value: Any) -> None:
    """A ``LookupError`` for ``--data data`` where ``data`` holds the arrays as attributes (``digits.load()``'s
    split): cg.train took it for one array and said 'data has 1 array(s) but the loss needs 2 placeholder(s)'."""
    if isinstance(value, tuple | list | dict) or hasattr(value, "shape") or hasattr(value, "__array__"):
        return
    found = [attr for attr in dir(value) if not attr.startswith("_") and _is_array(value, attr)]
    arrays = [f"{name}.{attr}" for attr in sorted(found, key=lambda attr: "train" not in attr)]  # training first
    if arrays:
        raise LookupError(
            f"--data {name!r} is a {type(value).__name__} holding arrays, not an array: name the arrays, from "
            f"{', '.join(arrays)} (e.g. --data {','.join(arrays[:2])})"
        )


def _is_array(owner: Any, attr: str) -> bool:
    try:
        value = getattr(owner, attr)
    except Exception:  # a property that fails is no array to offer
        return False
    return hasattr(value, "shape") and hasattr(value, "dtype")


# cg.train's keywords in its messages, as %train's flags: the user typed flags, and cannot pass a keyword.
FLAG_WORDS: list[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]]] = [
    (re.compile(r"^cg\.train: "), ""),
    (re.compile(r"\bbatch_size<=(\d+)"), r"--batch-size \1 or less"),
    (re.compile(r"\bmode='(sync|async)'"), r"--mode \1"),
    (re.compile(r"\b(replicas_to_aggregate|batch_size|max_staleness|checkpoint_every|checkpoint_dir|resume_from)\b"),
     lambda m: "--" + m.group(1).replace("_", "-")),
]  # fmt: skip


def in_flags(message: str) -> str:
    """A ``cg.train`` message in ``%train``'s words: ``batch_size<=719`` is ``--batch-size 719 or less``.

    >>> in_flags("cg.train: replicas_to_aggregate is for mode='sync' (async mode applies every gradient on arrival)")
    '--replicas-to-aggregate is for --mode sync (async mode applies every gradient on arrival)'
    """
    for pattern, words in FLAG_WORDS:
        message = pattern.sub(words, message)
    return message


CHECKPOINT_NAME = re.compile(r"ckpt-[0-9]{10}")  # a checkpoint's folder, as the parameter servers name it


def resume_point(path: str, shards: int) -> tuple[Path, str]:
    """``(checkpoint_dir, name)`` for ``cg.train(..., resume_from=name)`` from ``--resume-from path``.

    ``path`` is a checkpoint's folder (``.../ckpt-0000000300``) or the folder
    holding a job's checkpoints (its latest then). The checkpoint must be
    complete for each of the cluster's ``shards`` parameter servers; a
    ``ValueError`` says what is wrong otherwise.
    """
    from cellgraph.cluster.ps.checkpoint import list_checkpoints

    shards = max(shards, 1)  # a cluster without parameter servers is refused by cg.train, saying so
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise ValueError(f"--resume-from {path!r}: there is no such folder")
    root, name = (folder.parent, folder.name) if CHECKPOINT_NAME.fullmatch(folder.name) else (folder, None)
    # A checkpoint counts when every shard's part of it is complete (a crash can leave one half written).
    complete = set.intersection(*({c.name for c in list_checkpoints(root, s, shards)} for s in range(shards)))
    if name is None:
        if not complete:
            raise ValueError(
                f"--resume-from {path!r} holds no complete checkpoint for {shards} parameter server(s): give a "
                "job's checkpoint_dir, or one of its checkpoints' folders (job.checkpoints names them)"
            )
        return root, max(complete)
    if name not in complete:
        raise ValueError(
            f"--resume-from {path!r} is not a complete checkpoint for {shards} parameter server(s) "
            f"(complete ones in {str(root)!r}: {', '.join(sorted(complete)) or 'none'})"
        )
    return root, name


def _too_few_workers(cluster: Cluster, replicas: int, workers: int) -> str:
    """What to do when ``--replicas`` asks for more replicas than the cluster has training workers."""
    need = f"--replicas {replicas} needs {replicas} training workers and the cluster has {workers}: give --replicas {workers} (or leave it out: one per training worker)"
    if cluster.kind == "local":
        return f"{need}, or run %cluster scale {replicas} first"
    return f"{need}, or start {replicas - workers} more with 'dask worker {cluster.scheduler_address} --resources worker=1'"


def _no_training_workers(cluster: Cluster) -> str:
    """What to do about a cluster with no training worker: one started here restarts, another gets one started."""
    if cluster.kind == "local":
        return (
            "the cluster has no training workers now (%cluster status lists them; lost workers come back with "
            "%cluster down then %cluster up)"
        )
    address = cluster.scheduler_address
    how = (  # an in-process scheduler takes no worker from a shell
        "give a worker the Dask resource 'worker'"
        if address.startswith("inproc://")
        else f"start one with 'dask worker {address} --resources worker=1'"
    )
    return f"the cluster at {address} has no training workers now (%cluster status lists them): {how}"
