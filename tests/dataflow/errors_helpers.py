"""Small builders shared by the error-message tests."""

from __future__ import annotations

import re

import pytest

import cellgraph as cg


def ph(*shape: int | None, dtype: str = "float32", name: str = "x") -> cg.Tensor:
    """A placeholder of ``shape`` in the default graph."""
    return cg.placeholder(shape, dtype, name=name)


def raises(error: type[Exception], message: str) -> pytest.RaisesExc:
    """``pytest.raises`` matching ``message`` literally (shapes are full of parentheses)."""
    return pytest.raises(error, match=re.escape(message))
