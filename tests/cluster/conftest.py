"""Fixtures shared by the cluster tests."""

from __future__ import annotations

from collections.abc import Iterator

import distributed
import pytest


@pytest.fixture(scope="module")
def client() -> Iterator[distributed.Client]:
    """A real Dask scheduler and one worker of three threads, in this process (no training: tasks of the test's)."""
    with distributed.LocalCluster(n_workers=1, threads_per_worker=3, processes=False, dashboard_address=None) as c:
        with distributed.Client(c) as client:
            yield client
