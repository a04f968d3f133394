"""Learning-rate schedules: the rate as a function of the global step, in one definition.

A schedule is a small frozen dataclass with ``value(step) -> float``. The
same object is used everywhere a learning rate is: a graph optimizer
(``cg.optim.SGD(learning_rate=cg.optim.cosine_decay(...))``) computes it from
its ``global_step`` with the ``LearningRateSchedule`` op, whose kernels call
``value``; a parameter server calls ``value`` at its own global step
(``OptimizerConfig.learning_rate_at``). Both evaluate it in float64, so a
variable trained on a server moves as it would locally.

Each kind has a name (``kind``) shared by the op's attrs, the optimizer
config's protobuf form (``LearningRateScheduleProto``) and a checkpoint's
manifest; ``fields()`` and :func:`schedule_from_fields` convert to and from
those plain forms. Every field is checked when a schedule is made: a bad one
is a ``ValueError`` naming the schedule and the field.

Examples
--------
>>> s = cosine_decay(0.1, decay_steps=100, warmup_steps=10)
>>> s.value(0), s.value(5), s.value(10), round(s.value(60), 4), s.value(110)
(0.0, 0.05, 0.1, 0.05, 0.0)
>>> exponential_decay(1.0, decay_steps=10, decay_rate=0.5, staircase=True).value(25)
0.25
>>> piecewise_constant([100, 200], [1.0, 0.5, 0.1]).value(150)
0.5
"""

from __future__ import annotations

import bisect
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any


def _number(schedule: str, name: str, value: Any, low: float = 0.0, high: float | None = None) -> float:
    """``value`` as a float in ``[low, high]``, or a ValueError naming the field."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        raise ValueError(f"{schedule}: {name} must be a finite number, got {value!r}")
    if float(value) < low or (high is not None and float(value) > high):
        bound = f"in [{low:g}, {high:g}]" if high is not None else f"{low:g} or more"
        raise ValueError(f"{schedule}: {name} must be {bound}, got {value!r}")
    return float(value)


def _count(schedule: str, name: str, value: Any, low: int) -> int:
    """``value`` as an int of at least ``low``, or a ValueError naming the field."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < low:
        raise ValueError(f"{schedule}: {name} must be an int, {low} or more, got {value!r}")
    return int(value)


class Schedule:
    """Base of every schedule: ``kind`` names it, ``value(step)`` is the rate at global step ``step``."""

    kind: str  # each subclass's name for it, a field of its own

    def value(self, step: int) -> float:
        raise NotImplementedError

    def fields(self) -> dict[str, Any]:
        """Every field by name, as plain values (tuples, floats, ints, bools): the op's attrs and the proto's."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.init}  # type: ignore[arg-type]


@dataclass(frozen=True)
class PiecewiseConstant(Schedule):
    """``values[0]`` up to and including step ``boundaries[0]``, ``values[1]`` up to ``boundaries[1]``, ...

    TensorFlow's ``piecewise_constant``: ``values`` has one entry more than
    ``boundaries``, which rise strictly.
    """

    boundaries: tuple[int, ...]
    values: tuple[float, ...]
    # A field (not a ClassVar) so that dataclasses.asdict, which a checkpoint's manifest uses, records it.
    kind: str = field(default="piecewise_constant", init=False, repr=False)

    def __post_init__(self) -> None:
        where = self.kind
        bounds = tuple(_count(where, f"boundaries[{i}]", b, 0) for i, b in enumerate(self.boundaries))
        rates = tuple(_number(where, f"values[{i}]", v) for i, v in enumerate(self.values))
        if len(rates) != len(bounds) + 1:
            raise ValueError(
                f"{where}: values must have one entry more than boundaries, got {len(rates)} values "
                f"for {len(bounds)} boundaries"
            )
        for i in range(1, len(bounds)):
            if bounds[i] <= bounds[i - 1]:
                raise ValueError(f"{where}: boundaries must rise strictly, got {list(bounds)}")
        object.__setattr__(self, "boundaries", bounds)
        object.__setattr__(self, "values", rates)

    def value(self, step: int) -> float:
        return self.values[bisect.bisect_left(self.boundaries, step)]


@dataclass(frozen=True)
class ExponentialDecay(Schedule):
    """``initial_learning_rate * decay_rate ** (step / decay_steps)``; with ``staircase`` the exponent is floored."""

    initial_learning_rate: float
    decay_steps: int
    decay_rate: float
    staircase: bool = False
    kind: str = field(default="exponential_decay", init=False, repr=False)

    def __post_init__(self) -> None:
        where = self.kind
        object.__setattr__(
            self, "initial_learning_rate", _number(where, "initial_learning_rate", self.initial_learning_rate)
        )
        object.__setattr__(self, "decay_steps", _count(where, "decay_steps", self.decay_steps, 1))
        object.__setattr__(self, "decay_rate", _number(where, "decay_rate", self.decay_rate))
        if not isinstance(self.staircase, bool):
            raise ValueError(f"{where}: staircase must be True or False, got {self.staircase!r}")

    def value(self, step: int) -> float:
        exponent = step / self.decay_steps
        if self.staircase:
            exponent = math.floor(exponent)
        return self.initial_learning_rate * self.decay_rate**exponent


@dataclass(frozen=True)
class CosineDecay(Schedule):
    """A linear warm-up from 0 to ``initial_learning_rate`` over ``warmup_steps``, then a cosine decay
    over ``decay_steps`` more steps down to ``alpha * initial_learning_rate``, where it stays.

    ``lr(s) = initial * s / warmup_steps`` for ``s < warmup_steps``; then, with
    ``t = min(s - warmup_steps, decay_steps) / decay_steps``,
    ``lr = initial * ((1 - alpha) * (1 + cos(pi t)) / 2 + alpha)``: Keras' ``CosineDecay(0.0, decay_steps,
    alpha, warmup_target=initial, warmup_steps=warmup_steps)`` (whose warm-up starts from its first argument);
    after the warm-up, torch's ``CosineAnnealingLR(T_max=decay_steps, eta_min=alpha * initial)`` up to its
    ``T_max`` (past it torch's rate rises again, this one stays at its floor).
    """

    initial_learning_rate: float
    decay_steps: int
    warmup_steps: int = 0
    alpha: float = 0.0
    kind: str = field(default="cosine_decay", init=False, repr=False)

    def __post_init__(self) -> None:
        where = self.kind
        object.__setattr__(
            self, "initial_learning_rate", _number(where, "initial_learning_rate", self.initial_learning_rate)
        )
        object.__setattr__(self, "decay_steps", _count(where, "decay_steps", self.decay_steps, 1))
        object.__setattr__(self, "warmup_steps", _count(where, "warmup_steps", self.warmup_steps, 0))
        object.__setattr__(self, "alpha", _number(where, "alpha", self.alpha, 0.0, 1.0))

    def value(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.initial_learning_rate * step / self.warmup_steps
        t = min(step - self.warmup_steps, self.decay_steps) / self.decay_steps
        return self.initial_learning_rate * ((1 - self.alpha) * 0.5 * (1 + math.cos(math.pi * t)) + self.alpha)


SCHEDULES: dict[str, type[Schedule]] = {
    cls.kind: cls
    for cls in (PiecewiseConstant, ExponentialDecay, CosineDecay)  # type: ignore[misc]
}
# The fields each kind takes, in declaration order (for the op's attrs and the proto).
FIELDS: dict[str, tuple[str, ...]] = {
    kind: tuple(f.name for f in fields(cls) if f.init)  # type: ignore[arg-type]
    for kind, cls in SCHEDULES.items()
}


def schedule_from_fields(kind: str, values: Mapping[str, Any]) -> Schedule:
    """The schedule of ``kind`` from its fields by name (others are ignored); ValueError for an unknown kind."""
    if kind not in SCHEDULES:
        raise ValueError(f"learning-rate schedule {kind!r} is not one of {', '.join(SCHEDULES)}")
    taken = {name: values[name] for name in FIELDS[kind] if name in values}
    for name in ("boundaries", "values"):
        if name in taken:
            taken[name] = tuple(taken[name])
    return SCHEDULES[kind](**taken)


# ------------------------------------------------------------------ constructors (cg.optim.*)
def piecewise_constant(boundaries: Sequence[int], values: Sequence[float]) -> PiecewiseConstant:
    """``values[i]`` while ``boundaries[i-1] < step <= boundaries[i]`` (TensorFlow's ``piecewise_constant``).

    Examples
    --------
    >>> import cellgraph as cg
    >>> cg.optim.piecewise_constant([1000], [0.1, 0.01]).value(1001)
    0.01
    """
    return PiecewiseConstant(tuple(boundaries), tuple(values))


def exponential_decay(
    initial_learning_rate: float, decay_steps: int, decay_rate: float, staircase: bool = False
) -> ExponentialDecay:
    """``initial_learning_rate * decay_rate ** (step / decay_steps)``, floored exponent with ``staircase``.

    Examples
    --------
    >>> import cellgraph as cg
    >>> cg.optim.exponential_decay(0.1, decay_steps=100, decay_rate=0.5).value(100)
    0.05
    """
    return ExponentialDecay(initial_learning_rate, decay_steps, decay_rate, staircase)


def cosine_decay(
    initial_learning_rate: float, decay_steps: int, warmup_steps: int = 0, alpha: float = 0.0
) -> CosineDecay:
    """Linear warm-up to ``initial_learning_rate`` over ``warmup_steps``, then cosine decay to
    ``alpha * initial_learning_rate`` over ``decay_steps``.

    Examples
    --------
    >>> import cellgraph as cg
    >>> sgd = cg.optim.SGD(learning_rate=cg.optim.cosine_decay(0.1, decay_steps=1000, warmup_steps=100))
    >>> sgd.learning_rate.value(100)
    0.1
    """
    return CosineDecay(initial_learning_rate, decay_steps, warmup_steps, alpha)


__all__ = [
    "FIELDS",
    "SCHEDULES",
    "CosineDecay",
    "ExponentialDecay",
    "PiecewiseConstant",
    "Schedule",
    "cosine_decay",
    "exponential_decay",
    "piecewise_constant",
    "schedule_from_fields",
]
