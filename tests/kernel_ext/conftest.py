"""Fixtures: a fresh shell with the extension loaded, and a record of what the magics display."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell

from cellgraph.kernel_ext import display

from .shells import new_shell


@pytest.fixture
def shell() -> Iterator[InteractiveShell]:
    yield from new_shell()


@pytest.fixture
def shown(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """What the magics display, in order (instead of displaying it)."""
    seen: list[Any] = []
    monkeypatch.setattr(display, "display", seen.append)
    return seen
