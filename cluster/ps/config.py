"""What a parameter-server job is: its variables, its optimizer, its training mode.

These plain dataclasses are shared by the store, the server, the client and
the checkpoints; ``cluster/ps/messages.py`` converts them to and from their
protobuf messages (``protos/parameter_service.proto``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal

import numpy as np

from cellgraph.dataflow.optimizer_registry import OPTIMIZER_KINDS, Value, kinds
from cellgraph.dataflow.schedules import Schedule, schedule_from_fields

from ..errors import ParameterServerError

Mode = Literal["sync", "async"]
OptimizerKind = str  # a kind of dataflow/optimizer_registry.py: "sgd", "momentum", "adam", "rmsprop", ...
NonFinite = Literal["reject", "skip_step", "apply"]
NONFINITE: tuple[NonFinite, ...] = ("reject", "skip_step", "apply")

# Names off the wire are untrusted: a message shows at most this many characters of one
# and this many names of a list, so that an error stays far below gRPC's metadata limit.
NAME_CHARS_SHOWN = 64
NAMES_SHOWN = 8

# The slots each optimizer keeps beside a variable at its default flags, from the optimizer registry (a flag may
# add one: OptimizerConfig.slots() says which a job keeps). Adam's "t" (its step count, for bias correction) is
# a scalar float64 per variable.
SLOTS: dict[str, tuple[str, ...]] = {
    kind: tuple(slot.name for slot in OPTIMIZER_KINDS.lookup(kind).slots_for({})) for kind in kinds()
}
# The slots that are one scalar per variable (Adam's "t"), not the variable's shape: the registry says which.
SCALAR_SLOTS: dict[str, frozenset[str]] = {
    kind: frozenset(slot.name for slot in OPTIMIZER_KINDS.lookup(kind).slots if slot.scalar) for kind in kinds()
}


def quoted(name: str) -> str:
    """``'name'``, cut to ``NAME_CHARS_SHOWN`` characters: ``'aaaa'... (100,000 characters)``."""
    if len(name) <= NAME_CHARS_SHOWN:
        return repr(name)
    return f"{name[:NAME_CHARS_SHOWN]!r}... ({len(name):,} characters)"


def check_moving_momentum(name: str, momentum: float) -> None:
    """Refuse a moving statistic's momentum outside [0, 1] (NaN too) with INVALID_ARGUMENT, naming the variable."""
    if not 0.0 <= momentum <= 1.0:
        raise ParameterServerError(
            f"variable {quoted(name)}: moving_momentum must be in [0, 1], got {momentum!r}", "INVALID_ARGUMENT"
        )


def listed(names: Iterable[str], quote: bool = True) -> str:
    """``'a', 'b' and 9,998 more``: at most ``NAMES_SHOWN`` names, each cut as ``quoted`` cuts it.

    Examples
    --------
    >>> listed(["w", "b"])
    "'w', 'b'"
    >>> listed([f"v{i}" for i in range(10)], quote=False)
    'v0, v1, v2, v3, v4, v5, v6, v7 and 2 more'
    """
    names = list(names)
    shown = [quoted(n) if quote or len(n) > NAME_CHARS_SHOWN else n for n in names[:NAMES_SHOWN]]
    text = ", ".join(shown)
    return text + (f" and {len(names) - NAMES_SHOWN:,} more" if len(names) > NAMES_SHOWN else "")


@dataclass(frozen=True)
class VariableSpec:
    """One variable held by a shard: its name, dtype and the shape of the piece held.

    For a variable split across shards, ``rows`` is the ``[start, stop)`` range
    of axis 0 this piece covers and ``full_shape`` the whole variable's shape;
    an unsplit variable has ``rows == (0, shape[0])`` (or ``(0, 0)`` for a scalar).
    """

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    full_shape: tuple[int, ...] | None = None
    rows: tuple[int, int] | None = None
    # A moving statistic: instead of applying the optimizer, the server moves it towards the pushed values (their
    # mean in sync mode), ``value = momentum * value + (1 - momentum) * pushed``, and keeps no slots for it.
    moving: bool = False
    momentum: float = 0.0

    @functools.cached_property
    def nbytes(self) -> int:
        # Python ints: a declared shape off the wire may overflow int64 (np.prod would wrap to 0). Kept: every
        # step asks it of every variable, on both sides.
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def whole_shape(self) -> tuple[int, ...]:
        return self.full_shape if self.full_shape is not None else self.shape


@dataclass(frozen=True)
class OptimizerConfig:
    """The update the server applies to a variable with the (averaged) gradient.

    ``kind`` names an entry of the optimizer registry; each field is one of
    its hyperparameters, and a field left ``None`` takes the kind's default.
    The fields ``kind`` does not take stay ``None``; giving one is an error.
    ``learning_rate`` may be a schedule (``dataflow/schedules.py``): the
    server then applies ``learning_rate_at(global_step)``, the rate at the
    step the update is applied in.

    Examples
    --------
    >>> OptimizerConfig("rmsprop", 0.01)
    OptimizerConfig(kind='rmsprop', learning_rate=0.01, decay=0.9, momentum=0.0, epsilon=1e-10)
    >>> from cellgraph.dataflow.schedules import exponential_decay
    >>> OptimizerConfig("sgd", exponential_decay(0.1, 10, 0.5)).learning_rate_at(20)
    0.025
    """

    kind: OptimizerKind = "sgd"
    learning_rate: float | Schedule | None = None
    momentum: float | None = None
    nesterov: bool | None = None
    beta1: float | None = None
    beta2: float | None = None
    epsilon: float | None = None
    decay: float | None = None
    weight_decay: float | None = None
    initial_accumulator_value: float | None = None
    amsgrad: bool | None = None
    centered: bool | None = None
    momentum_decay: float | None = None
    rho: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in OPTIMIZER_KINDS:
            raise ParameterServerError(
                f"optimizer kind {quoted(str(self.kind))} is not one of {', '.join(kinds())}", "INVALID_ARGUMENT"
            )
        definition = OPTIMIZER_KINDS.lookup(self.kind)
        given = {f.name: getattr(self, f.name) for f in fields(self)[1:] if getattr(self, f.name) is not None}
        # A schedule checked its own fields when it was made; the registry's rules are for numbers.
        if isinstance(self.learning_rate, Schedule):
            del given["learning_rate"]
        # A NaN learning rate is accepted by every kernel and turns the model into NaN at the first step.
        problem = definition.problem(given)
        if problem is not None:
            raise ParameterServerError(f"{self.kind} optimizer: {problem}", "INVALID_ARGUMENT")
        for hyper in definition.hyperparameters:
            if getattr(self, hyper.name) is None:
                object.__setattr__(self, hyper.name, hyper.default)

    def learning_rate_at(self, step: int) -> float:
        """The rate of an update applied at global step ``step``: the constant, or the schedule's value there."""
        rate = self.learning_rate
        assert rate is not None  # __post_init__ fills every hyperparameter of the kind
        return rate.value(step) if isinstance(rate, Schedule) else float(rate)

    @classmethod
    def from_fields(cls, values: Mapping[str, Any]) -> OptimizerConfig:
        """The config a checkpoint manifest records, reading only the fields its kind takes.

        A manifest written before the optimizer registry lists every field of
        every kind (an sgd job's has ``momentum=0.9``, ``beta1=0.9``, ...).
        """
        kind = values.get("kind", "sgd")
        known = OPTIMIZER_KINDS.lookup(kind).defaults() if kind in OPTIMIZER_KINDS else {}
        taken = {k: v for k, v in values.items() if k in known}
        rate = taken.get("learning_rate")
        if isinstance(rate, Mapping):  # a schedule, as dataclasses.asdict wrote it (its kind is a field)
            try:
                taken["learning_rate"] = schedule_from_fields(str(rate.get("kind")), rate)
            except ValueError as err:
                raise ParameterServerError(f"{kind} optimizer: {err}", "INVALID_ARGUMENT") from None
        return cls(kind, **taken)

    def slots(self) -> tuple[str, ...]:
        """The slots kept beside each variable with these hyperparameters (``amsgrad=True`` adds Adam's "vhat").

        >>> OptimizerConfig("rmsprop", centered=True).slots()
        ('ms', 'mg', 'mom')
        """
        return tuple(slot.name for slot in OPTIMIZER_KINDS.lookup(self.kind).slots_for(self.hyperparameters))

    @property
    def hyperparameters(self) -> dict[str, Value]:
        """The kind's hyperparameters but the learning rate, by name (what its update reads)."""
        return {name: getattr(self, name) for name in OPTIMIZER_KINDS.lookup(self.kind).names()}

    def __repr__(self) -> str:
        shown = {"learning_rate": self.learning_rate, **OPTIMIZER_KINDS.lookup(self.kind).shown(self.hyperparameters)}
        return f"OptimizerConfig(kind={self.kind!r}, " + ", ".join(f"{k}={v!r}" for k, v in shown.items()) + ")"


@dataclass(frozen=True)
class TrainingConfig:
    """How pushes become updates.

    ``sync``: the first ``replicas_to_aggregate`` gradients tagged with the
    global step are averaged and applied once, then the step advances; older
    tags are dropped as stale. ``async``: each gradient is applied on arrival,
    unless it was computed from parameters more than ``max_staleness`` versions
    old (``None``: no bound). ``checkpoint_every``: the server checkpoints its
    shard at every multiple of this global step by itself (0: only on ``Save``).
    ``nonfinite``: what a gradient holding NaN or Inf does: ``"reject"`` (the
    push is refused with INVALID_ARGUMENT naming the variable), ``"skip_step"``
    (its step's update is dropped and counted) or ``"apply"``.
    """

    mode: Mode = "async"
    replicas_to_aggregate: int = 1
    max_staleness: int | None = None
    checkpoint_every: int = 0
    nonfinite: NonFinite = "reject"

    def __post_init__(self) -> None:
        if self.mode not in ("sync", "async"):
            raise ParameterServerError(f"training mode {self.mode!r} is not 'sync' or 'async'", "INVALID_ARGUMENT")
        if self.replicas_to_aggregate < 1:
            raise ParameterServerError(
                f"replicas_to_aggregate must be at least 1, got {self.replicas_to_aggregate}", "INVALID_ARGUMENT"
            )
        if self.max_staleness is not None and self.max_staleness < 0:
            raise ParameterServerError(
                f"max_staleness must be 0 or more (or None), got {self.max_staleness}", "INVALID_ARGUMENT"
            )
        if self.checkpoint_every < 0:
            raise ParameterServerError(
                f"checkpoint_every must be 0 (no automatic checkpoints) or more, got {self.checkpoint_every}",
                "INVALID_ARGUMENT",
            )
        if self.nonfinite not in NONFINITE:
            raise ParameterServerError(
                f"nonfinite must be one of {', '.join(map(repr, NONFINITE))}, got {self.nonfinite!r}",
                "INVALID_ARGUMENT",
            )

    def layout_problem(self, shards: int) -> str | None:
        """Why these rules cannot train variables spread over ``shards`` servers, or None.

        An async staleness bound is judged by each server against its own
        global step, and servers see concurrent pushes in different orders: a
        push could be applied by one server and dropped as stale by another,
        half a step that nobody is told of (TensorFlow's async training has no
        bound, so never drops). Until the servers agree on a push, such a bound
        needs every variable on one server.

        Examples
        --------
        >>> TrainingConfig("async", max_staleness=2).layout_problem(1) is None
        True
        >>> TrainingConfig("async", max_staleness=2).layout_problem(2)[:56]
        'max_staleness=2 in async mode needs every variable on on'
        """
        if self.mode != "async" or self.max_staleness is None or shards <= 1:
            return None
        return (
            f"max_staleness={self.max_staleness} in async mode needs every variable on one parameter server, but "
            f"the job's variables are on {shards}: each server judges a push's staleness by its own global step, "
            "so one could apply a push that another drops as stale (half a step, silently). Use max_staleness=None, "
            "mode='sync' (with replicas_to_aggregate for backup workers), one ps task, or put every variable on "
            "one with cg.device('/job:ps/task:0')"
        )
