"""Where a job's parameter servers run: started in the cluster's PS workers (or a colocated job's training
workers) by a worker plugin, found again after Dask restarts one, and stopped with the job.

``ParameterServerHosting`` is the part of ``Cluster`` that does this; ``Cluster``
gives it the client, and its other part, ``WorkerRoles`` (``worker_roles.py``),
the workers' roles and ``_run`` (``client.run`` with a deadline).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from .calls import CALL_TIMEOUT_S, call_with_deadline
from .errors import ClusterError
from .ps_plugin import ParameterServerPlugin, plugin_name, server_address

if TYPE_CHECKING:
    from distributed import Client

T = TypeVar("T")

# How often parameter_servers() looks again for servers that a restarted PS worker starts.
RESTART_POLL_S = 0.25
# How often a job's servers' plugin is sent to the workers while workers are lost under it (each loss fails one).
REGISTER_ATTEMPTS = 3


class ParameterServerHosting:
    """Starts, finds and stops each job's parameter servers (a part of ``Cluster``)."""

    client: Client
    _assigned: tuple[list[str], list[str] | None] | None
    _jobs: dict[str, list[str]]  # job id -> its servers' host:port, in shard order
    # A job whose servers run in its training workers (ps_placement="colocated"): their names, in shard order
    # (a worker Dask restarts keeps its name, and the job's plugin starts its server there again).
    _hosts: dict[str, list[str]]

    def ps_workers(self) -> list[str]:
        raise NotImplementedError  # WorkerRoles's (worker_roles.py), the other part of Cluster

    def _workers_info(self) -> dict[str, dict[str, Any]]:
        raise NotImplementedError  # WorkerRoles's (worker_roles.py), the other part of Cluster

    def _run(
        self, function: Callable[..., T], workers: Sequence[str], what: str, *args: Any, timeout: float = CALL_TIMEOUT_S
    ) -> dict[str, T]:
        raise NotImplementedError  # WorkerRoles's (worker_roles.py), the other part of Cluster

    def scheduler_gone(self) -> str | None:
        raise NotImplementedError  # Cluster's own (cluster.py)

    def start_parameter_servers(
        self,
        job_id: str,
        token: str,
        checkpoint_dir: str | Path | None = None,
        hosts: Sequence[str] | None = None,
    ) -> list[str]:
        """Start job ``job_id``'s parameter server in every PS worker; return their ``host:port``, in PS-task order.

        Parameters
        ----------
        job_id
            The job; one set of servers per job.
        token
            The token every call to the servers must carry.
        checkpoint_dir
            Where the servers save and restore checkpoints (reachable from every PS worker).
        hosts
            Addresses of the workers to run the servers in, in shard order, instead of the PS workers: a
            colocated job's training workers.

        Examples
        --------
        >>> cluster.start_parameter_servers("job-1", token="s3cret")  # doctest: +SKIP
        ['127.0.0.1:39441']
        """
        if not job_id or not token:
            raise ClusterError(
                f"start_parameter_servers(job_id={job_id!r}, token=...): both must be non-empty strings "
                "(cellgraph.cluster.ps.new_token() makes a token)"
            )
        if job_id in self._jobs:
            raise ClusterError(
                f"parameter servers for job '{job_id}' already run at {', '.join(self._jobs[job_id])}; "
                f"call stop_parameter_servers('{job_id}') first, or use another job id"
            )
        ps = list(hosts) if hosts is not None else self.ps_workers()
        if not ps:
            raise ClusterError(
                f"job '{job_id}' needs a parameter-server worker and this cluster has none: start it with "
                "Cluster.local(ps=1), give workers the Dask resource 'ps', call cluster.assign(ps=...), or "
                "train with ps_placement='colocated'"
            )
        # With roles from resources, the plugin picks its workers by resource itself, so a PS worker that
        # Dask restarts starts its server again; with roles assigned by hand it is told the addresses; a
        # colocated job names its hosts by worker name, which a restarted worker keeps.
        chosen: Sequence[str] | None = ps if self._assigned is not None else None
        if hosts is not None:
            info = self._workers_info()
            unknown = [a for a in ps if a not in info]
            if unknown:
                raise ClusterError(f"job '{job_id}': no worker at {', '.join(unknown)} to run a parameter server in")
            chosen = self._hosts[job_id] = [str(info[a].get("name", a)) for a in ps]
        plugin = ParameterServerPlugin(token, job_id, checkpoint_dir, workers=chosen)
        name = plugin_name(job_id)
        try:
            self._register(plugin, name, job_id, ps)
        except Exception as err:
            self._unregister(name)
            raise ClusterError(
                f"could not start the parameter servers of job '{job_id}' on {', '.join(ps)}: {err}"
            ) from err
        found = self._run(server_address, ps, f"find job '{job_id}''s servers", job_id)
        missing = [a for a in ps if not found.get(a)]
        if missing:
            self._unregister(name)
            raise ClusterError(
                f"no parameter server of job '{job_id}' runs on PS worker(s) {', '.join(missing)}; "
                "did the worker restart while it started? Try again"
            )
        self._jobs[job_id] = [str(found[a]) for a in ps]
        return list(self._jobs[job_id])

    def _register(self, plugin: ParameterServerPlugin, name: str, job_id: str, ps: Sequence[str]) -> None:
        """Register the job's plugin on every worker, again when a worker was lost while Dask sent it.

        Dask's scheduler sends a plugin to every worker, training workers too, and fails the whole registration
        when one of them dies meanwhile ('Stream is closed'): a training worker killed during a job's start failed
        the start as if its parameter servers could not start. The scheduler keeps the plugin for the workers
        that join later, so sending it again reaches those that are left (a server already started is restarted,
        before the job has used it). A lost PS worker itself fails the start at once, naming it: its server is
        what the job was starting.
        """
        for attempt in range(1, REGISTER_ATTEMPTS + 1):
            try:
                call_with_deadline(
                    lambda: self.client.register_plugin(plugin, name=name), f"start job '{job_id}''s servers"
                )
                return
            except OSError:  # distributed's CommClosedError: a worker's (or the scheduler's) connection closed
                if attempt == REGISTER_ATTEMPTS or self.scheduler_gone() is not None:
                    raise
                time.sleep(RESTART_POLL_S)  # the scheduler removes the lost worker meanwhile
                gone = [a for a in ps if a not in self._workers_info()]
                if gone:
                    raise ClusterError(
                        f"PS worker(s) {', '.join(gone)} left the cluster while the servers started (a killed worker "
                        "is started again by its nanny): cg.train(...) again once it is back"
                    ) from None

    def _servers_of(self, job_id: str) -> list[str]:
        """The workers that host job ``job_id``'s servers now, in shard order: its hosts (by name), or the PS workers."""
        names = self._hosts.get(job_id)
        if names is None:
            return self.ps_workers()
        by_name = {str(w.get("name")): a for a, w in self._workers_info().items()}
        return [by_name[n] for n in names if n in by_name]

    def parameter_servers(
        self,
        job_id: str,
        timeout: float = CALL_TIMEOUT_S,
        replacing: Sequence[str] = (),
        cancel: threading.Event | None = None,
    ) -> list[str]:
        """Job ``job_id``'s servers' ``host:port`` now, in PS-task order.

        With ``replacing`` (servers that stopped answering), wait at most
        ``timeout`` seconds until every PS worker hosts a server again and none
        is at a replaced address: Dask's nanny restarts a lost PS worker, and
        the scheduler sends it the job's plugin, which starts a new, empty server.
        ``cancel`` (the job's closed event) ends that wait early with a ``ClusterError``: a job closed meanwhile
        wants no servers.

        Examples
        --------
        >>> cluster.parameter_servers("job-1", timeout=60, replacing=["127.0.0.1:39441"])  # doctest: +SKIP
        ['127.0.0.1:40517']
        """
        if job_id not in self._jobs:
            running = ", ".join(f"'{j}'" for j in self._jobs) or "none"
            raise ClusterError(f"no parameter servers of job '{job_id}' were started here; running jobs: {running}")
        wanted, gone = len(self._jobs[job_id]), set(replacing)
        deadline = time.monotonic() + timeout
        while True:
            try:
                ps = self._servers_of(job_id)
                # Within what is left of the wait: a PS worker stopped (SIGSTOP) or cut off never answers, and the
                # whole wait would otherwise be CALL_TIMEOUT_S however short the job's timeout.
                left = min(CALL_TIMEOUT_S, max(RESTART_POLL_S, deadline - time.monotonic()))
                what = f"find job '{job_id}''s servers"
                found = self._run(server_address, ps, what, job_id, timeout=left) if ps else {}
                addresses = [str(found[a]) for a in ps if found.get(a)]
                if len(ps) == wanted and len(addresses) == wanted and not gone & set(addresses):
                    self._jobs[job_id] = addresses
                    return list(addresses)
                seen = f"PS workers {', '.join(ps) or 'none'}, servers at {', '.join(addresses) or 'none'}"
            except Exception as err:  # a worker that died a moment ago, still on the scheduler's list: ask again
                seen = f"{type(err).__name__}: {err}"
            if cancel is not None and cancel.is_set():
                raise ClusterError(f"job '{job_id}' was closed while it waited for its parameter servers ({seen})")
            lost = self.scheduler_gone()
            if lost is not None:  # nothing restarts a worker now: say so at once, not at the deadline
                raise ClusterError(f"job '{job_id}' waited for its parameter servers, and {lost}")
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"job '{job_id}' needs {wanted} parameter server(s) in place of {', '.join(sorted(gone)) or 'none'}"
                    f", and {timeout:.3g} s later there are: {seen}. Does the cluster restart lost workers (a nanny), "
                    "with the 'ps' resource?"
                )
            if cancel is None:
                time.sleep(RESTART_POLL_S)
            else:
                cancel.wait(RESTART_POLL_S)

    def stop_parameter_servers(self, job_id: str, timeout: float = CALL_TIMEOUT_S) -> None:
        """Stop job ``job_id``'s parameter servers (each lets calls in flight finish, briefly), within ``timeout``.

        Examples
        --------
        >>> cluster.stop_parameter_servers("job-1")  # doctest: +SKIP
        """
        if job_id not in self._jobs:
            running = ", ".join(f"'{j}'" for j in self._jobs) or "none"
            raise ClusterError(f"no parameter servers of job '{job_id}' were started here; running jobs: {running}")
        del self._jobs[job_id]
        self._hosts.pop(job_id, None)
        call_with_deadline(
            lambda: self.client.unregister_worker_plugin(plugin_name(job_id)), f"stop job '{job_id}''s servers", timeout
        )

    def _unregister(self, name: str) -> None:
        """Take a plugin off every worker after a failed start; a failure here would hide the first one."""
        try:
            call_with_deadline(lambda: self.client.unregister_worker_plugin(name), f"remove plugin {name}")
        except Exception:  # noqa: S110 - the caller raises the error that matters
            pass
