"""Every ``Examples`` section in the package's docstrings runs and shows what it says."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import cellgraph
import cellgraph.cluster
import cellgraph.dataflow

# The subpackages live in their own folders (pyproject's package-dir), so each
# is walked from its own path.
PACKAGES = [cellgraph, cellgraph.dataflow, cellgraph.cluster]
SKIP = ("cellgraph.__main__", "_pb2", "_pb2_grpc", ".kernels.cuda")
MODULES = sorted(
    info.name
    for package in PACKAGES
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + ".")
    if not any(part in info.name for part in SKIP)
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} of {result.attempted} docstring examples failed in {name}"
