from __future__ import annotations

from collections.abc import Iterator

import pytest

import cellgraph as cg


@pytest.fixture
def fresh_graph() -> Iterator[cg.Graph]:
    """A new graph, the default one for the test's duration."""
    g = cg.Graph()
    with g.as_default():
        yield g
