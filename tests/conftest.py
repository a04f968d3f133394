"""Test-session policy for the CUDA column (tests marked ``cuda``).

``NUMBA_ENABLE_CUDASIM`` is read once, when ``numba.cuda`` is imported, so it
must be in the environment before the test process starts; this file does not
set it. A ``cuda`` test runs on a real GPU when ``numba.cuda`` sees one, on
Numba's simulator when ``NUMBA_ENABLE_CUDASIM=1``, and is skipped, with that
reason, when neither holds. The plain run still checks the column on the
simulator: ``tests/dataflow/test_op_table.py::test_cuda_column_on_simulator``
runs ``pytest -m cuda`` in a subprocess with the simulator on.
"""

from __future__ import annotations

import pytest

from cellgraph.examples import digits

NO_CUDA = (
    "no CUDA GPU visible to numba.cuda and NUMBA_ENABLE_CUDASIM is not 1: "
    "run `NUMBA_ENABLE_CUDASIM=1 pytest -m cuda` to use Numba's CUDA simulator"
)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("cuda") is None:
        return
    from cellgraph.dataflow.kernels import cuda

    if not cuda.available():
        pytest.skip(NO_CUDA)


@pytest.fixture(scope="session")
def data() -> digits.Split:
    """The digits data set, split 80/20 with seed 0 (the training tests' data)."""
    return digits.load()
