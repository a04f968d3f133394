"""Every ``Examples`` section in the package's docstrings runs and shows what it says.

Each module with examples is a test that must run all of them; the modules
without any are named in ``NO_EXAMPLES``, so that a module losing its examples
(or a new one without) is a decision someone sees, not a silent pass.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import cellgraph
import cellgraph.cluster
import cellgraph.dataflow
import cellgraph.kernel_ext
import cellgraph.widgets

# The subpackages live in their own folders (pyproject's package-dir), so each
# is walked from its own path.
PACKAGES = [cellgraph, cellgraph.dataflow, cellgraph.cluster, cellgraph.widgets, cellgraph.kernel_ext]
# Generated protobuf code; the CUDA kernels, whose import needs numba.cuda (their tests run them).
NOT_WALKED = ("cellgraph.__main__", "_pb2", "_pb2_grpc", ".kernels.cuda")
MODULES = sorted(
    info.name
    for package in PACKAGES
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + ".")
    if not any(part in info.name for part in NOT_WALKED)
)
# Modules with no docstring example that runs: internals, kernels, and code whose examples need a cluster, a
# kernel or a browser (marked ``# doctest: +SKIP``; their tests run that code).
NO_EXAMPLES = {
    "cellgraph.cli",
    "cellgraph.examples",
    "cellgraph.examples.digits",
    "cellgraph.examples.distributed",
    "cellgraph.examples.models",
    "cellgraph.examples.train",
    "cellgraph.optim",
    "cellgraph.testing",
    "cellgraph.testing.netns",
    "cellgraph.cluster.dask_cluster",
    "cellgraph.cluster.ps_hosting",
    "cellgraph.dataflow.kernels.cpu.cumulative",
    "cellgraph.dataflow.kernels.cpu.top_k",
    "cellgraph.dataflow.errors",
    "cellgraph.dataflow.fusion",
    "cellgraph.dataflow.graph",
    "cellgraph.dataflow.kernels",
    "cellgraph.dataflow.kernels.cpu",
    "cellgraph.dataflow.kernels.cpu.array",
    "cellgraph.dataflow.kernels.cpu.conv",
    "cellgraph.dataflow.kernels.cpu.elementwise",
    "cellgraph.dataflow.kernels.cpu.matmul",
    "cellgraph.dataflow.kernels.cpu.nn",
    "cellgraph.dataflow.kernels.cpu.pool",
    "cellgraph.dataflow.kernels.cpu.reduce",
    "cellgraph.dataflow.kernels.cpu.scalar",
    "cellgraph.dataflow.ops",
    "cellgraph.dataflow.ops.base",
    "cellgraph.dataflow.ops.math",
    "cellgraph.dataflow.ops.training",
    "cellgraph.dataflow.ops.transfer",
    "cellgraph.dataflow.registry",
    "cellgraph.dataflow.shapes",
    "cellgraph.dataflow.threads",
    "cellgraph.dataflow.transport",
    "cellgraph.dataflow.variables",
    "cellgraph.cluster.errors",
    "cellgraph.cluster.job",
    "cellgraph.cluster.ps",
    "cellgraph.cluster.ps.autosave",
    "cellgraph.cluster.ps.command",
    "cellgraph.cluster.ps.messages",
    "cellgraph.cluster.ps.servicer",
    "cellgraph.widgets.cluster_view",
    "cellgraph.widgets.graph_info",
    "cellgraph.widgets.graph_layered",
    "cellgraph.widgets.graph_style",
    "cellgraph.widgets.graph_tree",
    "cellgraph.widgets.reprs",
    "cellgraph.widgets.training_monitor",
    "cellgraph.widgets.training_monitor_figures",
    "cellgraph.kernel_ext.arguments",
    "cellgraph.kernel_ext.cells",
    "cellgraph.kernel_ext.display",
    "cellgraph.kernel_ext.extension",
    "cellgraph.kernel_ext.magics_graph",
}
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def runnable_examples(name: str) -> int:
    """How many examples the docstrings of module ``name`` hold, not counting those marked ``# doctest: +SKIP``."""
    tests = doctest.DocTestFinder().find(importlib.import_module(name))
    return sum(1 for test in tests for example in test.examples if not example.options.get(doctest.SKIP))


def test_the_modules_without_examples_are_the_listed_ones() -> None:
    without = {name for name in MODULES if runnable_examples(name) == 0}
    assert sorted(without - NO_EXAMPLES) == [], "modules with no docstring example that runs: add some, or list them"
    assert sorted(NO_EXAMPLES - without) == [], "listed in NO_EXAMPLES, but have examples (or are gone): unlist"


@pytest.mark.parametrize("name", [name for name in MODULES if name not in NO_EXAMPLES])
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=FLAGS)
    assert result.failed == 0, f"{result.failed} of {result.attempted} docstring examples failed in {name}"
    expected = runnable_examples(name)
    assert result.attempted == expected > 0, f"{name}: ran {result.attempted} of its {expected} examples"
