"""``Cluster``: a Dask cluster seen as parameter-server and training workers.

Dask is the engine: ``Cluster.local`` starts an embedded
``distributed.LocalCluster`` bound to 127.0.0.1, ``Cluster.connect`` joins a
scheduler someone else started (dask-kubernetes, dask-jobqueue, a cloud
cluster), ``Cluster.from_client`` wraps a ``distributed.Client`` the user
already has. Roles are Dask worker resources: a worker with resource ``ps``
is a parameter server, any other worker trains; ``Cluster.assign`` overrides
that for a cluster whose workers carry no such resources.

Task indices follow the workers' names in natural order (``ps-2`` before
``ps-10``), then their addresses, so a worker that Dask restarts under the
same name keeps its index. Which worker does what (roles, ``assign``,
``devices``) is ``WorkerRoles`` (``worker_roles.py``); where a job's servers
run, ``ParameterServerHosting`` (``ps_hosting.py``): both are parts of
``Cluster``.

Examples
--------
>>> from cellgraph.cluster.cluster import Cluster
>>> with Cluster.local(workers=1, ps=1) as cluster:
...     print(cluster.devices()[:2])  # then a device per GPU that numba.cuda sees on the worker
...     addresses = cluster.start_parameter_servers("demo", token="s3cret")
...     print(len(addresses), addresses[0].startswith("127.0.0.1:"))
['/job:ps/task:0/device:cpu:0', '/job:worker/task:0/device:cpu:0']
1 True
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, Literal

from distributed import Client, LocalCluster
from distributed.security import Security

from cellgraph.dataflow import display

from .calls import CALL_TIMEOUT_S, call_with_deadline
from .dask_cluster import (
    CHECK_CONNECT,
    close_quietly,
    refuse_a_worker_importing_the_script,
    refuse_an_unguarded_script,
    script_top_level,
    start_local,
)
from .errors import ClusterError
from .gpus import GpuCounts
from .ps_hosting import ParameterServerHosting
from .ps_plugin import PS_RESOURCE
from .reach import open_client, tls_configured, unreachable
from .worker_roles import GPU_RESOURCE, WorkerInfo, WorkerRoles, natural_key

WORKER_RESOURCE = "worker"
# Said only for a tls:// address: for any other the hint sends the user the wrong way.
CHECK_TLS = "; a tls:// scheduler needs security=, a distributed.security.Security with its certificates"
TLS_MISSING = (
    "neither security= nor Dask's configuration gives the client certificates TLS needs: pass "
    "security=distributed.security.Security(tls_ca_file=..., tls_client_cert=..., tls_client_key=...), or set "
    "distributed.comm.tls.ca-file, distributed.comm.tls.client.cert and .key in Dask's configuration"
)
# How often scale() looks at the workers while they start or leave.
SCALE_POLL_S = 0.1


class Cluster(WorkerRoles, ParameterServerHosting):
    """A Dask cluster whose workers are parameter servers (``ps``) and training workers (``worker``).

    Build one with ``Cluster.local``, ``Cluster.connect`` or ``Cluster.from_client``;
    close it with ``close()`` or a ``with`` block. It closes only what it started.

    Examples
    --------
    >>> cluster = Cluster.local(workers=2, ps=1)  # doctest: +SKIP
    >>> cluster  # doctest: +SKIP
    <Cluster tcp://127.0.0.1:40109 (local): ps/0 tcp://127.0.0.1:37047, worker/0 ..., worker/1 ...>
    >>> cluster.close()  # doctest: +SKIP
    """

    def __init__(
        self,
        client: Client,
        *,
        local_cluster: LocalCluster | None = None,
        owns_client: bool = False,
        kind: str = "external",
    ) -> None:
        self.client = client
        self.kind = kind
        self.scheduler_address: str = str(client.scheduler.address)
        """The scheduler's address (``tcp://...`` or ``tls://...``)."""
        self._local_cluster = local_cluster
        self._owns_client = owns_client
        self._assigned: tuple[list[str], list[str] | None] | None = None
        self._jobs: dict[str, list[str]] = {}
        self._hosts: dict[str, list[str]] = {}  # a colocated job's hosts (ps_hosting)
        self.ps_placement: str = "dedicated"
        """Where jobs on this cluster put their parameter servers by default: ``"dedicated"`` (the PS workers) or
        ``"colocated"`` (one shard in each of the job's training workers; ``Cluster.local(ps="colocated")``)."""
        # What close() runs first: each open job's own close (replicas told to stop, servers stopped), so that the
        # workers shut down with nothing running and no job's supervisor looks at a client that is gone.
        self._job_closers: dict[str, Callable[[], None]] = {}
        self._closed = False
        self._gpus = GpuCounts()

    # ------------------------------------------------------------------ construction
    @classmethod
    def local(
        cls,
        workers: int = 2,
        ps: int | Literal["colocated"] = 1,
        threads_per_worker: int = 1,
        gpus: int | None = None,
        secure: bool = False,
        timeout: float = 60.0,
    ) -> Cluster:
        """Start an embedded ``distributed.LocalCluster``: ``ps`` PS processes and ``workers`` training processes.

        Parameters
        ----------
        workers
            Training worker processes (Dask resource ``worker``).
        ps
            Parameter-server worker processes (Dask resource ``ps``), or ``"colocated"``: none, and every job
            runs one parameter-server shard in each of its training workers (``cg.train(ps_placement=...)``).
        threads_per_worker
            Threads of each worker process.
        gpus
            GPUs each training worker offers (Dask resource ``GPU``); ``None`` for none.
        secure
            TLS between every process, with temporary certificates (``Security.temporary()``).
        timeout
            Seconds to wait for every worker to join; a ``ClusterError`` after that.

        Examples
        --------
        >>> with Cluster.local(workers=2, ps=1) as cluster:  # doctest: +SKIP
        ...     cluster.ps_workers(), cluster.training_workers()
        (['tcp://127.0.0.1:40123'], ['tcp://127.0.0.1:35761', 'tcp://127.0.0.1:41889'])
        """
        colocated = ps == "colocated"
        if colocated:
            ps = 0
        if isinstance(ps, str) or workers < 1 or ps < 0 or threads_per_worker < 1 or (gpus is not None and gpus < 0):
            raise ClusterError(
                f"Cluster.local(workers={workers}, ps={ps}, threads_per_worker={threads_per_worker}, gpus={gpus}): "
                "needs workers >= 1, ps >= 0 (or 'colocated'), threads_per_worker >= 1 and gpus >= 0 (or None)"
            )
        if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and timeout > 0):
            # Dask reads a timeout of 0 as "wait for ever"; every wait here has a deadline.
            raise ClusterError(f"Cluster.local(timeout={timeout!r}): needs a finite number of seconds above 0")
        refuse_a_worker_importing_the_script()
        caller = sys._getframe(1)
        script = script_top_level(caller)
        refuse_an_unguarded_script(script, caller.f_lineno)
        training: dict[str, float] = {WORKER_RESOURCE: 1}
        if gpus:
            training[GPU_RESOURCE] = gpus
        roles = {f"ps-{i}": {PS_RESOURCE: 1.0} for i in range(ps)}
        roles.update({f"worker-{i}": dict(training) for i in range(workers)})
        client, local = start_local(roles, threads_per_worker, secure, timeout, script)
        made = cls(client, local_cluster=local, owns_client=True, kind="local")
        made.ps_placement = "colocated" if colocated else "dedicated"
        with contextlib.suppress(ClusterError):  # a worker slow to answer is counted at the first cg.train instead
            made.training_gpus()  # counted now, so that cg.train does not wait for it
        return made

    def scale(self, workers: int, timeout: float = 60.0) -> None:
        """Run ``workers`` training workers from now on (a cluster this process started; PS workers stay).

        New workers copy the settings of the existing ones; the newest leave
        first (a replica running there is submitted again elsewhere by its job).
        Raises ``ClusterError`` for a connected cluster (scale it with whatever
        started it), for fewer than one worker, or when the workers do not
        arrive within ``timeout`` seconds.
        """
        local = self._local_cluster
        if self.kind != "local" or local is None:
            raise ClusterError(
                f"scale: not supported for connected clusters ({self.kind}, {self.scheduler_address}): "
                "scale it with whatever started it (dask-kubernetes, dask-jobqueue, the cloud console)"
            )
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
            raise ClusterError(f"scale: a cluster needs at least 1 training worker, got {workers!r}")
        spec = local.worker_spec
        training = sorted((name for name in spec if str(name).startswith("worker-")), key=natural_key)
        template = spec[training[-1]]
        for i in range(len(training), workers):
            spec[f"worker-{i}"] = {"cls": template["cls"], "options": dict(template["options"])}
        for name in training[workers:]:
            del spec[name]
        # SpecCluster.scale(n) with n entries already in worker_spec starts the missing workers and retires the extra.
        local.scale(len(spec))
        deadline = time.monotonic() + timeout
        while len(self.training_workers()) != workers:
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"scale: asked for {workers} training workers and {timeout:g} s later there are "
                    f"{len(self.training_workers())}; is the machine short of memory or processes?"
                )
            time.sleep(SCALE_POLL_S)
        with contextlib.suppress(ClusterError):  # else counted at the next cg.train
            self.training_gpus()  # new workers counted now, not at the next cg.train

    @classmethod
    def connect(cls, address: str, security: Security | None = None, timeout: float = 10.0) -> Cluster:
        """Join the Dask scheduler at ``address`` (``tcp://host:8786``, ``tls://...``); it is not closed by ``close()``.

        Raises ``ClusterError`` within about ``timeout`` seconds when the
        scheduler does not answer (a port that accepts and stays silent too),
        and within ``reach.PROBE_S`` (3 s) for a refused port or an unknown
        host, with the reason; a ``tls://`` address needs ``security=`` or
        Dask's TLS configuration, and is refused at once without either.

        Examples
        --------
        >>> cluster = Cluster.connect("tcp://scheduler.example.org:8786")  # doctest: +SKIP
        >>> cluster.assign(ps=1)  # doctest: +SKIP
        """
        from distributed.comm import get_address_host_port

        try:
            # Parsed before any Client exists: a Client that fails to parse its address leaves Dask's shared event
            # loop in a state that breaks the next Client of this process.
            get_address_host_port(address)
        except ValueError as err:  # no port, a port that is not a number, an unknown scheme
            raise ClusterError(
                f"{address!r} is not a Dask scheduler address ({err}): give one like tcp://host:8786 or tls://host:8786"
            ) from err
        if address.startswith("tls://") and not tls_configured(security):
            raise ClusterError(f"{address} is a TLS address, and {TLS_MISSING}")
        # Dask would retry a refused port or an unknown host for the whole time-out, then call it a time-out.
        reason = unreachable(address)
        if reason is not None:
            raise ClusterError(f"could not reach the Dask scheduler at {address}: {reason}")
        try:
            client = open_client(address, security, timeout)
        except (OSError, TimeoutError) as err:
            raise ClusterError(
                f"could not reach the Dask scheduler at {address} within {timeout:g} s ({err}): {CHECK_CONNECT}"
                + (CHECK_TLS if address.startswith("tls://") else "")
            ) from err
        made = cls(client, owns_client=True, kind="connected")
        with contextlib.suppress(ClusterError):  # workers without roles yet (assign() comes later): counted then
            made.training_gpus()  # counted now, so that cg.train does not wait for it
        return made

    @classmethod
    def from_client(cls, client: Client) -> Cluster:
        """Wrap a ``distributed.Client`` the user already has; ``close()`` leaves the client and its cluster open.

        Examples
        --------
        >>> from distributed import Client  # doctest: +SKIP
        >>> cluster = Cluster.from_client(Client("tcp://scheduler:8786"))  # doctest: +SKIP
        """
        return cls(client, owns_client=False, kind="client")

    # ------------------------------------------------------------------ lifetime
    def on_close(self, job_id: str, close: Callable[[], None]) -> None:
        """Have ``close()`` call ``close`` (a job's) before it shuts anything down."""
        self._job_closers[job_id] = close

    def forget_on_close(self, job_id: str) -> None:
        """Undo ``on_close`` for ``job_id`` (the job closed by itself); nothing if it was not there."""
        self._job_closers.pop(job_id, None)

    @property
    def dashboard_link(self) -> str:
        """The Dask dashboard's URL (without bokeh installed, its page says to install it)."""
        return str(self.client.dashboard_link)

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
        return self._closed

    def scheduler_gone(self) -> str | None:
        """Why this cluster's Dask scheduler is gone, in words naming its address; None while it is connected (and
        for a cluster closed here: that one was let go, not lost).

        Dask's client leaves ``running`` when it loses its scheduler (``connecting`` while it tries again, then
        ``closed``), and cancels every task it holds at that moment: a job's replicas are gone with it.
        """
        status = str(getattr(self.client, "status", "running"))
        if self._closed or status in ("running", "newly-created"):
            return None
        return (
            f"the Dask scheduler at {self.scheduler_address} is gone (Dask's client lost its connection to it and is "
            f"{status!r})"
        )

    def close(self, timeout: float = 30.0) -> None:
        """Stop the parameter servers started here, then the client and the LocalCluster if this object started them.

        Closing twice does nothing more.
        """
        if self._closed:
            return
        for close_job in list(self._job_closers.values()):
            try:
                close_job()
            except Exception:  # noqa: S110 - the cluster may be gone already; the steps below end what is left
                pass
        self._closed = True
        try:
            for job_id in list(self._jobs):
                try:
                    self.stop_parameter_servers(job_id)
                except Exception:  # noqa: S110 - the cluster may be gone already; its servers went with it
                    pass
        finally:
            close_quietly(self.client if self._owns_client else None, self._local_cluster, timeout)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        address = self.scheduler_address
        if self._closed:
            return f"<Cluster {address} ({self.kind}), closed>"
        try:
            rows = self.workers()
        except Exception as err:  # a repr must not raise: say what went wrong instead
            return f"<Cluster {address} ({self.kind}): workers unknown ({type(err).__name__})>"
        roles = ", ".join(f"{w.role}/{w.task} {w.address}" if w.task is not None else f"idle {w.address}" for w in rows)
        return f"<Cluster {address} ({self.kind}): {roles or 'no workers'}>"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None, **_: Any) -> dict[str, Any]:
        """In a Jupyter kernel, this cluster's ClusterView; elsewhere, a line per worker."""
        return display.bundle("cluster", self, include, exclude)  # the widget side's, registered from above


# CALL_TIMEOUT_S, call_with_deadline, CHECK_CONNECT and WorkerInfo live in lower modules; importable from here too.
__all__ = [
    "CALL_TIMEOUT_S",
    "CHECK_CONNECT",
    "CHECK_TLS",
    "GPU_RESOURCE",
    "SCALE_POLL_S",
    "TLS_MISSING",
    "WORKER_RESOURCE",
    "Cluster",
    "ClusterError",
    "WorkerInfo",
    "call_with_deadline",
]
