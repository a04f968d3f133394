"""What one parameter-server shard holds, before any value: its variables, their optimizer slots, and the
dtype and shape of every tensor a checkpoint of it holds; and the checks of arrays against them.

``ParameterStore`` builds one from its specs and checks initial values,
pushes, pulled names and checkpoints with it; the layout never changes after that.

Examples
--------
>>> import numpy as np
>>> from cellgraph.cluster.ps.config import VariableSpec
>>> shard = ShardLayout([VariableSpec("w", np.dtype("float32"), (2,))], "adam")
>>> shard.slots_of["w"], sorted(shard.tensors)
(('m', 'v', 't'), ['w', 'w/m', 'w/t', 'w/v'])
>>> shard.check_tensor("w's gradient", np.zeros(3, np.float32), "w", "the variable has", "INVALID_ARGUMENT")
Traceback (most recent call last):
...
cellgraph.cluster.errors.ParameterServerError: w's gradient has shape (3,), the variable has (2,)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from ...dataflow.shapes import fmt
from ..errors import ParameterServerError
from .config import SCALAR_SLOTS, OptimizerConfig, VariableSpec, listed
from .pieces import Pieced
from .records import StoreState
from .updates import STEP_COUNT_DTYPE

TRAINABLE = ("float32", "float64")


def key_mismatch(what: str, found: Iterable[str], expected: Iterable[str]) -> str | None:
    """``"{what}: missing 'a'; unexpected 'b' (...)"`` when two sets of names differ, else None."""
    found, expected = list(found), list(expected)
    missing = [key for key in expected if key not in found]
    extra = [key for key in found if key not in expected]
    problems = [f"missing {listed(missing)}"] if missing else []
    if extra:
        problems.append(f"unexpected {listed(extra)} (the shard holds {listed(expected) or 'nothing'})")
    return f"{what}: {'; '.join(problems)}" if problems else None


class ShardLayout:
    """A shard's variables (float32 or float64, names unique), each one's slots for optimizer ``kind``, and
    every checkpoint tensor's dtype and shape (``tensors``, keyed like a checkpoint: ``"w"``, ``"w/m"``)."""

    def __init__(self, specs: Sequence[VariableSpec], optimizer: OptimizerConfig | str) -> None:
        # A kind alone is that kind at its defaults; a config's flags may add a slot (amsgrad's "vhat").
        config = optimizer if isinstance(optimizer, OptimizerConfig) else OptimizerConfig(optimizer)
        self.specs: dict[str, VariableSpec] = {}
        for spec in specs:
            if spec.name in self.specs:
                raise ParameterServerError(f"variable {spec.name!r} is listed twice in the shard", "INVALID_ARGUMENT")
            if np.dtype(spec.dtype).name not in TRAINABLE:
                raise ParameterServerError(
                    f"variable {spec.name!r} has dtype {np.dtype(spec.dtype).name}; "
                    f"a parameter server trains only {' or '.join(TRAINABLE)}",
                    "INVALID_ARGUMENT",
                )
            self.specs[spec.name] = spec
        # A moving statistic has no slots: the server moves it towards its pushed values, by weights in its own
        # dtype, as the graph's `var * momentum + value * (1 - momentum)` computes them.
        slots = config.slots()
        self.slots_of = {name: () if spec.moving else slots for name, spec in self.specs.items()}
        self.scalar_slots = SCALAR_SLOTS[config.kind]  # one value per variable (Adam's step count), not its shape
        self.moving_weights = {
            name: (spec.dtype.type(spec.momentum), spec.dtype.type(1.0 - spec.momentum))
            for name, spec in self.specs.items()
            if spec.moving
        }
        self.tensors: dict[str, tuple[np.dtype, tuple[int, ...]]] = {}
        for name, spec in self.specs.items():
            self.tensors[name] = (np.dtype(spec.dtype), tuple(spec.shape))
            for slot in self.slots_of[name]:
                key = f"{name}/{slot}"
                if key in self.specs:
                    raise ParameterServerError(
                        f"variable {key!r} has the name of slot {slot!r} of variable {name!r}; "
                        "their checkpoint keys would collide",
                        "INVALID_ARGUMENT",
                    )
                scalar = slot in self.scalar_slots
                self.tensors[key] = (STEP_COUNT_DTYPE, ()) if scalar else self.tensors[name]

    def fits(self, key: str, value: object) -> bool:
        """Whether ``value`` is a NumPy array of ``key``'s dtype and shape: the common case, checked before any
        message is made (a ``Pieced`` gradient is told apart by ``check_tensor``)."""
        dtype, shape = self.tensors[key]
        return value.__class__ is np.ndarray and value.dtype == dtype and value.shape == shape  # type: ignore[attr-defined]

    def check_tensor(self, what: str, value: object, key: str, expected: str, code: str) -> None:
        """Raise unless ``value`` has the dtype and shape of ``key``: "{what} has shape (3,), {expected} (2,)"."""
        if self.fits(key, value):
            return
        dtype, shape = self.tensors[key]
        if not isinstance(value, np.ndarray | Pieced):
            raise ParameterServerError(f"{what} is a {type(value).__name__}, not a NumPy array", code)
        if value.dtype != dtype:
            raise ParameterServerError(f"{what} has dtype {value.dtype}, {expected} {dtype}", code)
        if value.shape != shape:
            raise ParameterServerError(f"{what} has shape {fmt(value.shape)}, {expected} {fmt(shape)}", code)

    def check_initial(self, initial: Mapping[str, np.ndarray]) -> None:
        """Raise unless ``initial`` holds exactly the variables, each with its dtype and shape."""
        problem = key_mismatch("initial values", initial, self.specs)
        if problem:
            raise ParameterServerError(problem, "INVALID_ARGUMENT")
        for name in self.specs:
            self.check_tensor(f"initial value of {name!r}", initial[name], name, "the spec says", "INVALID_ARGUMENT")

    def check_names(self, names: Iterable[str], job_id: str) -> list[str]:
        """``names`` as a list, each a variable of the shard; else NOT_FOUND naming the others."""
        wanted = list(names)
        unknown = [name for name in wanted if name not in self.specs]
        if unknown:
            raise ParameterServerError(
                f"job {job_id!r}: no variable {listed(unknown)} on this shard; "
                f"it holds {listed(self.specs) or 'no variables'}",
                "NOT_FOUND",
            )
        return wanted

    def check_state(self, state: StoreState, job_id: str) -> None:
        """Raise FAILED_PRECONDITION unless checkpoint ``state`` fits this shard: every tensor and version, no
        other, each tensor with its dtype and shape, no negative step or version."""

        def refuse(problem: str) -> ParameterServerError:
            return ParameterServerError(f"checkpoint for job {job_id!r}: {problem}", "FAILED_PRECONDITION")

        if state.global_step < 0:
            raise refuse(f"global step {state.global_step} is negative")
        for label, found, expected in (
            ("tensors", state.tensors, self.tensors),
            ("versions", state.versions, self.specs),
        ):
            problem = key_mismatch(label, found, expected)
            if problem:
                raise refuse(problem)
        for name, version in state.versions.items():
            if version < 0:
                raise refuse(f"version {version} of {name!r} is negative")
        for key in self.tensors:
            what = f"checkpoint for job {job_id!r}: {key!r}"
            self.check_tensor(what, state.tensors[key], key, "the shard holds", "FAILED_PRECONDITION")
