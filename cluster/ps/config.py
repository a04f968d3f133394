"""What a parameter-server job is: its variables, its optimizer, its training mode.

These plain dataclasses are shared by the store, the server, the client and
the checkpoints; ``cluster/ps/messages.py`` converts them to and from their
protobuf messages (``protos/parameter_service.proto``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from ..errors import ParameterServerError

Mode = Literal["sync", "async"]
OptimizerKind = Literal["sgd", "momentum", "adam"]
NonFinite = Literal["reject", "skip_step", "apply"]
NONFINITE: tuple[NonFinite, ...] = ("reject", "skip_step", "apply")

# Names off the wire are untrusted: a message shows at most this many characters of one
# and this many names of a list, so that an error stays far below gRPC's metadata limit.
NAME_CHARS_SHOWN = 64
NAMES_SHOWN = 8

# The slots each optimizer keeps beside a variable, in the order its kernel takes them.
# Adam's "t" (its step count, for bias correction) is a scalar float64 per variable.
SLOTS: dict[str, tuple[str, ...]] = {"sgd": (), "momentum": ("momentum",), "adam": ("m", "v", "t")}


def quoted(name: str) -> str:
    """``'name'``, cut to ``NAME_CHARS_SHOWN`` characters: ``'aaaa'... (100,000 characters)``."""
    if len(name) <= NAME_CHARS_SHOWN:
        return repr(name)
    return f"{name[:NAME_CHARS_SHOWN]!r}... ({len(name):,} characters)"


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

    @property
    def nbytes(self) -> int:
        # Python ints: a declared shape off the wire may overflow int64 (np.prod would wrap to 0).
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def whole_shape(self) -> tuple[int, ...]:
        return self.full_shape if self.full_shape is not None else self.shape


@dataclass(frozen=True)
class OptimizerConfig:
    """The update the server applies to a variable with the (averaged) gradient."""

    kind: OptimizerKind = "sgd"
    learning_rate: float = 0.01
    momentum: float = 0.9
    nesterov: bool = False
    beta1: float = 0.9
    beta2: float = 0.999
    epsilon: float = 1e-8

    def __post_init__(self) -> None:
        if self.kind not in SLOTS:
            raise ParameterServerError(
                f"optimizer kind {quoted(str(self.kind))} is not one of {', '.join(SLOTS)}", "INVALID_ARGUMENT"
            )
        # A NaN learning rate is accepted by every kernel and turns the model into NaN at the first step.
        for name in ("learning_rate", "momentum", "epsilon"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ParameterServerError(
                    f"{self.kind} optimizer: {name} must be a finite number, 0 or more, got {value}", "INVALID_ARGUMENT"
                )
        for name in ("beta1", "beta2"):
            value = getattr(self, name)
            if not 0 <= value < 1:  # False for NaN; beta = 1 divides by 0 in Adam's bias correction
                raise ParameterServerError(
                    f"{self.kind} optimizer: {name} must be in [0, 1), got {value}", "INVALID_ARGUMENT"
                )


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
