"""What a job's supervisor decides from a replica task's future: lost with its worker, or failed on its own."""

from __future__ import annotations

from dataclasses import dataclass

import distributed
import pytest

from cellgraph.cluster.job_state import lost_with_worker


@dataclass
class Ended:
    """A replica task's future as the supervisor reads it: its status, and the exception it ended with."""

    status: str
    error: BaseException | None = None

    def exception(self) -> BaseException | None:
        return self.error


class KilledWorker(Exception):  # noqa: N818 - a user's own exception that happens to share Dask's name
    pass


@pytest.mark.parametrize(
    ("future", "lost"),
    [
        (Ended("cancelled"), True),  # Dask forgot the task: its scattered shard went with the worker
        (Ended("error", distributed.KilledWorker("cellgraph-replica-job-1-0", "tcp://127.0.0.1:1", 3)), True),
        (Ended("error", KilledWorker("not Dask's")), False),  # the type decides, not the name
        (Ended("error", ValueError("a bug")), False),
        (Ended("finished"), False),
        (Ended("pending"), False),
    ],
)
def test_a_lost_worker_is_known_by_the_exceptions_type(future: Ended, lost: bool) -> None:
    assert lost_with_worker(future) is lost
