"""What the magics share: parsing a line, ``--help``, errors that print their usage, and names from the namespace.

A magic given bad arguments raises ``UsageError``: IPython prints its message
(here: the problem, then the magic's usage) without a traceback, and marks the
cell as failed so that a notebook run stops there. Every check runs before the
magic changes anything.
"""

from __future__ import annotations

import argparse
import copy
import difflib
import inspect
import math
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument, argument_group
from IPython.utils.process import arg_split

from cellgraph.dataflow.errors import CellgraphError
from cellgraph.dataflow.optimizer_registry import OPTIMIZER_KINDS, Value
from cellgraph.dataflow.optimizers import CLASSES, Optimizer

if TYPE_CHECKING:
    from cellgraph.cluster.cluster import Cluster

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

NO_CLUSTER = "no cluster is up: run %cluster up (or %cluster connect ADDRESS) first, or bind a cg.Cluster to `cluster`"
USAGE_WIDTH = 100  # columns of a magic's usage and help
# ``--optimizer NAME[:RATE]``: each optimizer kind of the registry, with its default learning rate when no RATE is given.
OPTIMIZERS: dict[str, tuple[type[Optimizer], float]] = {
    kind: (cls, float(OPTIMIZER_KINDS.lookup(kind).defaults()["learning_rate"])) for kind, cls in CLASSES.items()
}

# ``--momentum 0.95``, ``--nesterov``, ...: every hyperparameter of the registry but the learning rate (``--optimizer
# NAME:RATE`` gives that), by name, with each kind that takes it and its default there.
OPTIMIZER_SETTINGS: dict[str, dict[str, Value]] = {}
for _kind, (_cls, _) in sorted(OPTIMIZERS.items()):
    for _hyper in OPTIMIZER_KINDS.lookup(_kind).hyperparameters[1:]:
        OPTIMIZER_SETTINGS.setdefault(_hyper.name, {})[_kind] = _hyper.default


def setting_flag(name: str) -> str:
    """The flag of hyperparameter ``name``: ``weight_decay`` is ``--weight-decay``."""
    return "--" + name.replace("_", "-")


def optimizer_arguments(magic: F) -> F:
    """``magic_arguments``' decorators for every flag of ``OPTIMIZER_SETTINGS``, in a group of the help; below the
    magic's other ``@argument`` lines, so that the group takes these flags only.

    A number is ``--momentum X``; a switch (every one is off by default: ``amsgrad``, ``nesterov``) is
    ``--amsgrad``, which turns it on.
    """
    for name, defaults in reversed(OPTIMIZER_SETTINGS.items()):
        flag = setting_flag(name)
        if all(isinstance(value, bool) for value in defaults.values()):
            add = argument(flag, dest=name, action="store_const", const=True, default=None,
                           help=f"turn on for {', '.join(defaults)} (default off)")  # fmt: skip
        else:
            takes = ", ".join(f"{kind} {value:g}" for kind, value in defaults.items())
            add = argument(flag, dest=name, type=number, default=None, metavar="X", help=f"defaults: {takes}")
        magic = add(magic)
    group = argument_group(
        "optimizer settings", "for the --optimizer kinds that take each (cg.optim's keywords of the same name)"
    )
    return group(magic)  # type: ignore[no-any-return]


class MagicFormatter(argparse.RawDescriptionHelpFormatter):
    """argparse's own help layout for a magic: ``usage: %train ...`` at ``USAGE_WIDTH`` columns, the docstring as
    written (dedented), and metavars as given.

    IPython's default (``MagicHelpFormatter``) writes the usage as a reST code
    block and wraps metavars in ``<>`` for the docstring it builds; in an error
    message or ``--help`` a user reads plain text. Each magic names this class
    with ``@kwds(formatter_class=MagicFormatter)``.
    """

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24, width: int | None = None):
        # IPython names the parser after the function (``train``); the user types ``%train`` (``%%graph`` for a cell).
        name = prog if prog.startswith("%") else "%" + prog
        super().__init__(name, indent_increment, max_help_position, width or USAGE_WIDTH)

    def _format_usage(self, usage: Any, actions: Any, groups: Any, prefix: Any) -> str:
        # %train's optimizer settings would double its usage (printed with each refusal): --help lists them.
        shown = [action for action in actions if action.dest not in OPTIMIZER_SETTINGS]
        return super()._format_usage(usage, shown, groups, prefix)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        # A docstring's first line has no indentation, the others have the method's: cleandoc takes both off.
        return super()._fill_text(inspect.cleandoc(text), width, indent)


def _parser(magic: Callable[..., Any], cell: bool) -> argparse.ArgumentParser:
    """``magic``'s parser, named as the cell magic (``%%graph``) when ``cell``: the same arguments either way."""
    parser: argparse.ArgumentParser = magic.parser  # type: ignore[attr-defined]
    if not cell:
        return parser
    as_cell = copy.copy(parser)
    as_cell.prog = "%%" + parser.prog.lstrip("%")
    return as_cell


def _prog(magic: Callable[..., Any], cell: bool) -> str:
    return ("%%" if cell else "%") + magic.parser.prog.lstrip("%")  # type: ignore[attr-defined]


def ask_cluster(prog: str, cluster: Cluster, question: Callable[[], T]) -> T:
    """``question()`` of ``cluster`` (its workers, its devices); a ``UsageError`` in words when its scheduler is gone
    or silent (a ``ClusterError`` at its deadline, or Dask's ``CommClosedError``, an ``OSError``), not Dask's
    connection pool's traceback."""
    try:
        return question()
    except (CellgraphError, OSError) as err:
        from cellgraph.widgets.reprs import unreadable  # the words ClusterView shows for it

        raise UsageError(f"{prog}: {unreadable(cluster, err)}") from None


def usage_error(magic: Callable[..., Any], problem: str, cell: bool = False) -> UsageError:
    """The error a magic raises for bad arguments: what was wrong, then how to call it."""
    prog = _prog(magic, cell)
    return UsageError(f"{prog}: {problem}\n{_parser(magic, cell).format_usage()}(see {prog} --help)")


def parse(magic: Callable[..., Any], line: str, cell: bool = False) -> argparse.Namespace | None:
    """``line`` parsed by ``magic``'s ``magic_arguments`` parser; ``None`` after printing the help for ``-h``/``--help``.

    Raises ``UsageError`` (problem and usage) for arguments the parser refuses.
    """
    try:
        # POSIX rules take the quotes off ("--checkpoint-dir '/tmp/my run'"); IPython's default keeps them.
        tokens = arg_split(line, posix=os.name == "posix", strict=True)
    except ValueError as err:  # an unclosed quote
        raise usage_error(magic, f"cannot split the arguments {line.strip()!r}: {err}", cell) from None
    if "-h" in tokens or "--help" in tokens:
        print(_parser(magic, cell).format_help())
        return None
    try:
        args: argparse.Namespace = magic.parser.parse_args(tokens)  # type: ignore[attr-defined]
    except UsageError as err:
        raise usage_error(magic, str(err) + _meant(magic.parser, tokens, str(err)), cell) from None  # type: ignore[attr-defined]
    return args


def _meant(parser: argparse.ArgumentParser, tokens: list[str], error: str) -> str:
    """For argparse's 'unrecognized arguments: --replica 2': the options that were likely meant (``--replicas``)."""
    if not error.startswith("unrecognized arguments:"):
        return ""
    options = [o for action in parser._actions for o in action.option_strings if o.startswith("--")]
    hints = []
    for before, token in zip(tokens, tokens[1:], strict=False):
        if before.endswith(",") and not token.startswith("-"):  # --data x_train, y_train: two words to argparse
            hints.append(f"'{before} {token}': a list takes no spaces, write {before}{token}")
    for token in tokens:
        flag = token.partition("=")[0]
        if flag.startswith("--") and flag not in options and flag in error:
            close = difflib.get_close_matches(flag, options, n=2, cutoff=0.75)
            if close:
                hints.append(f"{flag}: did you mean {' or '.join(sorted(close))}?")
    return f" ({'; '.join(hints)})" if hints else ""


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def count(text: str) -> int:
    """An argparse type: an integer of at least 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer of 0 or more, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer of 0 or more, got {text!r}")
    return value


def ps_count(text: str) -> int | str:
    """An argparse type: parameter-server processes, 0 or more, or ``colocated`` (a shard in each training
    worker, as ``Cluster.local(ps="colocated")``)."""
    if text == "colocated":
        return text
    try:
        return count(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected an integer of 0 or more, or colocated, got {text!r}") from None


def positive_float(text: str) -> float:
    """An argparse type: a number above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):  # inf would make a deadline that never comes
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def lookup(namespace: Mapping[str, Any], path: str, what: str) -> Any:
    """The value of ``path`` (``loss`` or ``model.loss``) in the notebook's namespace; ``LookupError`` says why not.

    Only names and attributes: a magic's arguments are never evaluated as code.
    """
    parts = path.split(".")
    if not all(part.isidentifier() for part in parts):
        example = "data.x_train" if what == "--data" else "model.loss"
        raise LookupError(f"{what} {path!r} is not a name: give a variable of the notebook, or an attribute path "
                          f"such as {example} (a magic evaluates no code: bind the value to a name in a cell "
                          "first)")  # fmt: skip
    if parts[0] not in namespace:
        raise LookupError(f"{what} {path!r} is not defined in the notebook: run the cell that makes {parts[0]} first")
    value = namespace[parts[0]]
    for i, part in enumerate(parts[1:], start=1):
        if not hasattr(value, part):
            owner = ".".join(parts[:i])
            raise LookupError(f"{what} {path!r}: {owner} (a {type(value).__name__}) has no attribute {part!r}")
        value = getattr(value, part)
    return value


def number(text: str) -> float:
    """An argparse type: a number (the optimizer's own rules say which are allowed)."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def optimizer(spec: str, settings: Mapping[str, Value] | None = None) -> Optimizer:
    """``adam:1e-3`` as ``cg.optim.Adam(1e-3)``: a kind of the optimizer registry, and a learning rate (optional);
    ``settings`` (``{"amsgrad": True}``, from ``--amsgrad``) are the optimizer's other keywords.

    Raises ``ValueError`` naming what is wrong with ``spec`` or a setting.
    """
    given = {name: value for name, value in (settings or {}).items() if value is not None}
    name, _, rate = spec.partition(":")
    known = ", ".join(sorted(OPTIMIZERS))
    entry = OPTIMIZERS.get(name.strip().lower())
    if entry is None:
        close = difflib.get_close_matches(name.strip().lower(), OPTIMIZERS, n=1)
        meant = f", did you mean {close[0]!r}?" if close else ";"
        raise ValueError(f"--optimizer {spec!r}: unknown optimizer {name!r}{meant} known: {known} (e.g. adam:1e-3)")
    cls, default_rate = entry
    definition = OPTIMIZER_KINDS.lookup(cls.kind)
    wrong = [name for name in given if cls.kind not in OPTIMIZER_SETTINGS[name]]
    if wrong:
        flags = ", ".join(setting_flag(name) for name in wrong)
        takes = ", ".join(setting_flag(name) for name in definition.names()) or "none of these settings"
        goes = "; ".join(f"{setting_flag(name)} goes with --optimizer {', '.join(OPTIMIZER_SETTINGS[name])}"
                         for name in wrong)  # fmt: skip
        raise ValueError(f"{flags}: {cls.kind} (cg.optim.{cls.__name__}) has no such setting; it takes {takes}. {goes}")
    learning_rate = default_rate
    if rate:
        try:
            learning_rate = float(rate)
        except ValueError:
            raise ValueError(
                f"--optimizer {spec!r}: the learning rate {rate!r} is not a number (e.g. adam:1e-3)"
            ) from None
    try:
        return cls(learning_rate, **given)
    except ValueError as err:  # the optimizer's own checks: a rate of 0 or less, a setting out of its range
        # Name the flag whose value the optimizer refused (the registry's rules are what it checked).
        culprit = next((name for name in given if definition.problem({name: given[name]}) is not None), None)
        where = f"--optimizer {spec!r}" if culprit is None else f"{setting_flag(culprit)} {given[culprit]}"
        raise ValueError(f"{where}: {err}") from None
