"""Which worker does what: a Dask cluster's workers as parameter servers (``ps``), training workers (``worker``)
and idle ones, each with its task index, and the devices they offer.

``WorkerRoles`` is the part of ``Cluster`` that answers this (beside
``ParameterServerHosting``, which starts the servers where it says);
``Cluster`` gives it the client and keeps the roles ``assign`` decided. Roles
come from the workers' Dask resources (``ps`` makes a parameter server)
unless ``assign`` decided them by hand. Task indices follow the workers'
names in natural order (``node-2`` before ``node-10``), then their addresses,
so that a worker Dask restarts under the same name keeps its index. Every
answer asks the scheduler afresh: workers come and go while a job runs.

Examples
--------
The roles of a fixed worker list, standing in for a scheduler's:

>>> class Listed(WorkerRoles):
...     def __init__(self, info):
...         self.info, self._assigned = info, None
...     def _workers_info(self):
...         return self.info
>>> roles = Listed({
...     "tcp://10.0.0.5:1": {"name": "node-10"},
...     "tcp://10.0.0.6:1": {"name": "node-2", "resources": {"ps": 1}},
...     "tcp://10.0.0.7:1": {"name": "node-3"},
... })
>>> roles.ps_workers(), roles.training_workers()
(['tcp://10.0.0.6:1'], ['tcp://10.0.0.7:1', 'tcp://10.0.0.5:1'])
>>> roles.assign(ps=["node-10"])  # by name or address; every other worker trains
>>> [(w.role, w.task, w.name) for w in roles.workers()]
[('ps', 0, 'node-10'), ('worker', 0, 'node-2'), ('worker', 1, 'node-3')]
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from .calls import CALL_TIMEOUT_S, call_with_deadline
from .dask_cluster import CHECK_CONNECT, scheduler_workers
from .errors import ClusterError
from .gpus import GpuCounts, visible_gpus
from .ps_plugin import PS_RESOURCE

if TYPE_CHECKING:
    from distributed import Client

T = TypeVar("T")

GPU_RESOURCE = "GPU"


@dataclass(frozen=True)
class WorkerInfo:
    """One Dask worker as cellgraph sees it: its role (``ps``, ``worker``, or ``idle`` when left out by
    ``assign``), its task index within the role, and what Dask knows about it."""

    address: str
    role: str
    task: int | None
    name: str
    nthreads: int
    memory_limit: int
    gpus: int
    host: str
    # Bytes the worker process uses, as the scheduler last heard with its heartbeat (-1: not heard yet). A reading,
    # not an identity: left out of ==.
    memory: int = field(default=-1, compare=False)


def natural_key(name: str) -> tuple[str | int, ...]:
    """Sort ``worker-2`` before ``worker-10``: digits compare as numbers."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))


class WorkerRoles:
    """Which workers are parameter servers, which train, and what devices they offer (a part of ``Cluster``)."""

    client: Client
    scheduler_address: str
    # The roles assign() decided: (PS addresses, training addresses or None for every worker not a PS); None while
    # the workers' resources decide.
    _assigned: tuple[list[str], list[str] | None] | None
    _gpus: GpuCounts

    # ------------------------------------------------------------------ workers and roles
    def _workers_info(self) -> dict[str, dict[str, Any]]:
        return scheduler_workers(self.client)

    @staticmethod
    def _in_order(workers: Mapping[str, Mapping[str, Any]]) -> list[str]:
        return sorted(workers, key=lambda a: (natural_key(str(workers[a].get("name", ""))), a))

    def _roles(self) -> tuple[dict[str, dict[str, Any]], list[str], list[str]]:
        """(every worker's info, PS addresses, training addresses), both in task order."""
        info = self._workers_info()
        if self._assigned is not None:
            ps, worker = self._assigned
            ps = [a for a in ps if a in info]
            if worker is None:
                worker = [a for a in self._in_order(info) if a not in ps]
            return info, ps, [a for a in worker if a in info]
        ordered = self._in_order(info)
        ps = [a for a in ordered if info[a].get("resources", {}).get(PS_RESOURCE, 0) > 0]
        return info, ps, [a for a in ordered if a not in ps]

    def ps_workers(self) -> list[str]:
        """Addresses of the parameter-server workers, in task order."""
        return self._roles()[1]

    def training_workers(self) -> list[str]:
        """Addresses of the training workers, in task order."""
        return self._roles()[2]

    def workers(self) -> list[WorkerInfo]:
        """Every worker with its role and task index: PS workers, training workers, then idle ones."""
        info, ps, training = self._roles()
        rows = []
        for role, addresses in (("ps", ps), ("worker", training)):
            rows += [self._worker_info(a, info[a], role, task) for task, a in enumerate(addresses)]
        rows += [self._worker_info(a, info[a], "idle", None) for a in self._in_order(info) if a not in ps + training]
        return rows

    def processing(self) -> dict[str, list[str]]:
        """The keys of the tasks each worker runs or is about to run, as the scheduler sees them now.

        Raises ``ClusterError`` when the scheduler does not answer within ``CALL_TIMEOUT_S``.
        """
        try:
            found: dict[str, list[Any]] = self.client.sync(
                self.client.scheduler.processing, callback_timeout=CALL_TIMEOUT_S
            )
        except TimeoutError as err:
            raise ClusterError(
                f"the Dask scheduler at {self.scheduler_address} did not say what its workers run within "
                f"{CALL_TIMEOUT_S:g} s (stopped, overloaded or cut off?): {CHECK_CONNECT}"
            ) from err
        return {address: [str(key) for key in keys] for address, keys in found.items()}

    @staticmethod
    def _worker_info(address: str, info: Mapping[str, Any], role: str, task: int | None) -> WorkerInfo:
        return WorkerInfo(
            address=address,
            role=role,
            task=task,
            name=str(info.get("name", "")),
            nthreads=int(info.get("nthreads", 0)),
            memory_limit=int(info.get("memory_limit", 0)),
            gpus=int(info.get("resources", {}).get(GPU_RESOURCE, 0)),
            host=str(info.get("host", "")),
            memory=int(info.get("metrics", {}).get("memory", -1)),
        )

    def assign(self, ps: Sequence[str] | int, worker: Sequence[str] | None = None) -> None:
        """Decide the roles by hand, for workers that carry no ``ps``/``worker`` resources.

        Parameters
        ----------
        ps
            Addresses (or names) of the PS workers, in task order; or a count:
            the first ``ps`` workers in name order.
        worker
            Addresses (or names) of the training workers, in task order;
            ``None``: every worker that is not a PS.

        Examples
        --------
        >>> cluster.assign(ps=["tcp://10.0.0.5:40001"])  # doctest: +SKIP
        >>> cluster.assign(ps=1, worker=["tcp://10.0.0.6:40001", "tcp://10.0.0.7:40001"])  # doctest: +SKIP
        """
        info = self._workers_info()
        ordered = self._in_order(info)
        if isinstance(ps, int):
            if not 0 <= ps < len(ordered):
                raise ClusterError(
                    f"assign(ps={ps}): the cluster has {len(ordered)} workers, so ps must be in [0, {len(ordered)}) "
                    f"to leave at least one training worker; known workers: {self._known(info)}"
                )
            ps_addresses = ordered[:ps]
        else:
            ps_addresses = self._resolve(ps, info, "ps")
        worker_addresses = self._resolve(worker, info, "worker") if worker is not None else None
        both = sorted(set(ps_addresses) & set(worker_addresses or ()))
        if both:
            raise ClusterError(f"assign: {', '.join(both)} cannot be both a parameter server and a training worker")
        if len(set(ps_addresses)) != len(ps_addresses) or (
            worker_addresses is not None and len(set(worker_addresses)) != len(worker_addresses)
        ):
            raise ClusterError("assign: a worker is named twice in the same role")
        rest = [a for a in ordered if a not in ps_addresses] if worker_addresses is None else worker_addresses
        if not rest:
            raise ClusterError(f"assign leaves no training worker; known workers: {self._known(info)}")
        self._assigned = (ps_addresses, worker_addresses)

    def _resolve(self, given: Sequence[str], info: Mapping[str, Mapping[str, Any]], role: str) -> list[str]:
        if isinstance(given, str):
            given = [given]
        by_name = {str(w.get("name")): a for a, w in info.items()}
        resolved = [g if g in info else by_name.get(str(g), "") for g in given]
        unknown = [str(g) for g, a in zip(given, resolved) if not a]
        if unknown:
            raise ClusterError(
                f"assign({role}=...): no worker at {', '.join(unknown)}; known workers: {self._known(info)}"
            )
        return resolved

    def _known(self, info: Mapping[str, Mapping[str, Any]]) -> str:
        return ", ".join(f"{a} (name {info[a].get('name')})" for a in self._in_order(info)) or "none"

    # ------------------------------------------------------------------ devices
    def devices(self) -> list[str]:
        """Every device of the cluster, PS workers first: a CPU each, and each GPU numba.cuda sees on a training worker.

        The GPUs are counted on the workers themselves (``client.run``), never in this process.

        Examples
        --------
        >>> cluster.devices()  # doctest: +SKIP
        ['/job:ps/task:0/device:cpu:0', '/job:worker/task:0/device:cpu:0', '/job:worker/task:0/device:gpu:0']
        """
        _, ps, training = self._roles()
        gpus = self._gpus_of(training)
        names = [f"/job:ps/task:{i}/device:cpu:0" for i in range(len(ps))]
        for i, address in enumerate(training):
            names.append(f"/job:worker/task:{i}/device:cpu:0")
            names += [f"/job:worker/task:{i}/device:gpu:{k}" for k in range(gpus.get(address, 0))]
        return names

    def training_gpus(self) -> dict[str, int]:
        """How many GPUs numba.cuda sees on each training worker, counted there (once a worker: ``gpus.py``)."""
        _, _, training = self._roles()
        return self._gpus_of(training)

    def _gpus_of(self, workers: Sequence[str]) -> dict[str, int]:
        return self._gpus.of(workers, lambda missing: self._run(visible_gpus, missing, "count the GPUs"))

    def _run(
        self, function: Callable[..., T], workers: Sequence[str], what: str, *args: Any, timeout: float = CALL_TIMEOUT_S
    ) -> dict[str, T]:
        """``client.run(function, *args)`` on ``workers``, within ``timeout`` (``CALL_TIMEOUT_S``)."""
        return call_with_deadline(
            lambda: self.client.run(function, *args, workers=list(workers)),
            f"{what} on workers {', '.join(workers)}",
            timeout,
        )


__all__ = ["GPU_RESOURCE", "WorkerInfo", "WorkerRoles", "natural_key"]
