"""``NameTable``: which node and scope names a graph has in use, and the next free one.

A name counts as used with each of its prefixes (``dense``, ``dense/matmul``),
so a scope of a taken name gets a suffix too; removing a cell's nodes frees
their names, which a re-run then takes again.

>>> names = NameTable()
>>> names.take("c"); names.take("c_1")
>>> names.unique("c"), names.unique("d")
('c_2', 'd')
>>> names.release("c_1")
>>> names.unique("c")
'c_1'
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator


class NameTable:
    """The names in use, by prefix, each counted as often as it is taken (a scope reserves its own name)."""

    def __init__(self) -> None:
        self._uses: Counter[str] = Counter()
        # Per taken name, the lowest suffix that may be free: unique starts its search there instead of at _1
        # (a 20,000-node ONNX chain of one op spent 94 s in that search). Only a hint: each suffix is still
        # checked, and freeing a suffix below it lowers it (_free).
        self._suffix_from: dict[str, int] = {}

    def take(self, name: str) -> None:
        """Count ``name`` and every prefix of it as used once more."""
        for prefix in _prefixes(name):
            self._uses[prefix] += 1

    def release(self, name: str) -> None:
        """Undo one ``take(name)``: a prefix no longer used is free again."""
        for prefix in _prefixes(name):
            self._free(prefix)

    def reserve(self, scope: str) -> None:
        """Count the whole scope name ``scope`` (not its prefixes) as used once more, while the scope is open."""
        self._uses[scope] += 1

    def unreserve(self, scope: str) -> None:
        self._free(scope)

    def unique(self, full: str) -> str:
        """``full`` if free, else ``full`` suffixed ``_1``, ``_2``, ...: the first that is free."""
        if full not in self._uses:
            return full
        i = self._suffix_from.get(full, 1)
        while f"{full}_{i}" in self._uses:
            i += 1
        self._suffix_from[full] = i  # not i + 1: the caller may not take the name (a seed is derived from it)
        return f"{full}_{i}"

    def _free(self, prefix: str) -> None:
        self._uses[prefix] -= 1
        if self._uses[prefix]:
            return
        del self._uses[prefix]
        base, _, suffix = prefix.rpartition("_")
        if suffix.isdigit() and base in self._suffix_from:
            self._suffix_from[base] = min(self._suffix_from[base], int(suffix))


def _prefixes(name: str) -> Iterator[str]:
    parts = name.split("/")
    for i in range(1, len(parts) + 1):
        yield "/".join(parts[:i])
