"""A generic name -> value registry, and the one for op definitions.

A duplicate registration names the file and line of the earlier one, and a
miss lists every known name, so neither failure needs a debugger.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Generic, TypeVar

from .errors import RegistryError

T = TypeVar("T")


def _caller_location(depth: int) -> str:
    frame = sys._getframe(depth + 1)
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


class Registry(Generic[T]):
    """Values by name; each name may be registered once."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._values: dict[str, T] = {}
        self._where: dict[str, str] = {}

    def register(self, name: str, value: T, *, depth: int = 1) -> T:
        if name in self._values:
            raise RegistryError(f"{self.kind} {name!r} is already registered (at {self._where[name]})")
        self._values[name] = value
        self._where[name] = _caller_location(depth)
        return value

    def lookup(self, name: str) -> T:
        try:
            return self._values[name]
        except KeyError:
            known = ", ".join(sorted(self._values)) or "none"
            raise RegistryError(f"no {self.kind} named {name!r}; known: {known}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._values

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._values))

    def __len__(self) -> int:
        return len(self._values)
