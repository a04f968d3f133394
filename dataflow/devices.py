"""Device names: ``/job:<name>/task:<i>/device:<cpu|gpu>:<k>``, parsed, validated, merged.

Every part is optional, so ``"/device:gpu:0"``, ``"/job:ps"`` and
``"/job:worker/task:1"`` are partial specs. Nested ``with cg.device(...)``
scopes merge as in TensorFlow: the inner scope's parts win, the parts it leaves
out come from the enclosing scope.

Examples
--------
>>> from cellgraph.dataflow.devices import DeviceSpec, merge
>>> spec = DeviceSpec.parse("/job:worker/task:1")
>>> str(merge(spec, DeviceSpec.parse("/device:gpu:0")))
'/job:worker/task:1/device:gpu:0'
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from .errors import PlacementError

EXPECTED = "/job:<name>/task:<i>/device:<cpu|gpu>:<k> (every part optional, e.g. '/device:gpu:0' or '/job:ps')"
DEVICE_TYPES = ("cpu", "gpu")
# The key of OpDef.kernels that runs on each device type.
KERNEL_KEY = {"cpu": "cpu", "gpu": "cuda"}

# One pattern per part, in the order the parts must appear. "/cpu:0" and
# "/gpu:0" are TensorFlow's short forms of "/device:cpu:0".
_PARTS = [
    re.compile(r"job:(?P<job>[A-Za-z][A-Za-z0-9_-]*)"),
    re.compile(r"task:(?P<task>\d+)"),
    re.compile(r"(?:device:)?(?P<type>cpu|gpu)(?::(?P<index>\d+))?", re.IGNORECASE),
]


@dataclass(frozen=True)
class DeviceSpec:
    """A full or partial device name; ``None`` marks a part left open."""

    job: str | None = None
    task: int | None = None
    device_type: str | None = None
    index: int | None = None

    def __post_init__(self) -> None:
        if self.device_type is not None and self.device_type not in DEVICE_TYPES:
            raise PlacementError(f"device type {self.device_type!r} is not one of {', '.join(DEVICE_TYPES)}")
        if self.index is not None and self.device_type is None:
            raise PlacementError(f"device index {self.index} needs a device type; expected {EXPECTED}")

    @classmethod
    def parse(cls, text: str | DeviceSpec) -> DeviceSpec:
        """The spec ``text`` names; ``""`` is the empty spec. Raises ``PlacementError``."""
        if isinstance(text, DeviceSpec):
            return text
        if not isinstance(text, str):
            raise PlacementError(f"a device name must be a string, got {type(text).__name__}; expected {EXPECTED}")
        if text == "":
            return cls()
        if not text.startswith("/"):
            raise _malformed(text, "it must start with '/'")
        fields: dict[str, str] = {}
        next_part = 0
        for piece in text[1:].split("/"):
            for i, pattern in enumerate(_PARTS):
                match = pattern.fullmatch(piece)
                if match is None:
                    continue
                if i < next_part:
                    raise _malformed(text, f"'{piece}' repeats or comes after a later part")
                fields.update({k: v for k, v in match.groupdict().items() if v is not None})
                next_part = i + 1
                break
            else:
                raise _malformed(text, f"'{piece}' is not a job, task or device part")
        return cls(
            job=fields.get("job"),
            task=int(fields["task"]) if "task" in fields else None,
            device_type=fields["type"].lower() if "type" in fields else None,
            index=int(fields["index"]) if "index" in fields else None,
        )

    @property
    def is_full(self) -> bool:
        return None not in (self.job, self.task, self.device_type, self.index)

    def matches(self, other: DeviceSpec) -> bool:
        """Whether ``other`` agrees with every part this spec sets."""
        return all(
            mine is None or mine == theirs
            for mine, theirs in (
                (self.job, other.job),
                (self.task, other.task),
                (self.device_type, other.device_type),
                (self.index, other.index),
            )
        )

    def task_cpu(self) -> DeviceSpec:
        """The CPU of this spec's task (index 0)."""
        return replace(self, device_type="cpu", index=0)

    def __str__(self) -> str:
        out = ""
        if self.job is not None:
            out += f"/job:{self.job}"
        if self.task is not None:
            out += f"/task:{self.task}"
        if self.device_type is not None:
            out += f"/device:{self.device_type}"
            if self.index is not None:
                out += f":{self.index}"
        return out


def _malformed(text: str, why: str) -> PlacementError:
    return PlacementError(f"malformed device name {text!r}: {why}; expected {EXPECTED}")


def merge(outer: DeviceSpec, inner: DeviceSpec) -> DeviceSpec:
    """TensorFlow's rule: each part of ``inner`` that is set wins, the rest come from ``outer``."""
    return DeviceSpec(
        job=inner.job if inner.job is not None else outer.job,
        task=inner.task if inner.task is not None else outer.task,
        device_type=inner.device_type if inner.device_type is not None else outer.device_type,
        index=inner.index if inner.index is not None else outer.index,
    )


def canonical(text: str | DeviceSpec) -> str:
    """``text`` parsed and written back in the one canonical form."""
    return str(DeviceSpec.parse(text))


__all__ = ["DEVICE_TYPES", "KERNEL_KEY", "DeviceSpec", "canonical", "merge"]
