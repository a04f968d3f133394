"""``ParameterServerPlugin``: a Dask worker plugin that hosts one job's parameter server inside a PS worker.

``Client.register_plugin`` sends a plugin to every worker of the cluster, and
to every worker that joins later. ``setup`` therefore decides on the worker
whether it is one of the job's parameter servers: by default, a worker whose
Dask resources include ``ps`` (as ``Cluster.local`` starts them); when the
roles were assigned by hand (``Cluster.assign``), a worker whose address or
name is in ``workers``. Other workers keep the plugin but start nothing. This
is the documented mechanism, and it has a property the alternatives lack: a
PS worker that Dask restarts (same resources) starts its server again by
itself. A ``NannyPlugin`` would run in the nanny, not in the worker process
whose lifetime the server must share; ``client.run`` would start servers that
nobody stops when a worker closes.

The server listens on the worker's own host (127.0.0.1 on a LocalCluster) on
a free port; the client finds the address through Dask (``server_address``
run on the worker by ``client.run``), never from the user.

Examples
--------
>>> plugin = ParameterServerPlugin(token="s3cret", job_id="demo")
>>> plugin_name("demo")
'cellgraph-ps-demo'
>>> plugin.address is None  # set by setup(), on a PS worker only
True
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING

from distributed import WorkerPlugin
from distributed.comm import get_address_host

from .ps import create_server
from .ps.server import ParameterServer, close_servicer, host_port

if TYPE_CHECKING:
    from distributed import Worker

# A stopping server lets calls in flight finish for this long, then cancels them.
STOP_GRACE_S = 2.0
# ...and teardown waits at most this long for it to be stopped.
STOP_DEADLINE_S = 10.0
PS_RESOURCE = "ps"


def plugin_name(job_id: str) -> str:
    """The name under which job ``job_id``'s plugin is registered (one plugin, hence one server, per job)."""
    return f"cellgraph-ps-{job_id}"


class ParameterServerPlugin(WorkerPlugin):
    """Start job ``job_id``'s parameter server in each PS worker; stop it when the plugin or the worker goes.

    Parameters
    ----------
    token
        The job's token; the server refuses every call (but the health check) without it.
    job_id
        The job the servers belong to; it names the plugin (``plugin_name``).
    checkpoint_dir
        Where the servers write and read checkpoints (a path every PS worker can reach).
    workers
        Addresses or names of the workers that host a server. ``None`` (the
        default): the workers with Dask resource ``ps``.

    Examples
    --------
    >>> plugin = ParameterServerPlugin("s3cret", "job-1", workers=["tcp://127.0.0.1:40001"])
    >>> plugin.job_id, sorted(plugin.workers or ())
    ('job-1', ['tcp://127.0.0.1:40001'])
    """

    def __init__(
        self,
        token: str,
        job_id: str,
        checkpoint_dir: str | Path | None = None,
        *,
        workers: Collection[str] | None = None,
    ) -> None:
        self.token = token
        self.job_id = job_id
        self.checkpoint_dir = str(checkpoint_dir) if checkpoint_dir is not None else None
        self.workers = frozenset(workers) if workers is not None else None
        # Set by setup() on a PS worker; never pickled back (setup runs after the plugin was sent).
        self.address: str | None = None
        self._server: ParameterServer | None = None

    def hosts_server(self, worker: Worker) -> bool:
        """Whether ``worker`` is one of this job's parameter servers."""
        if self.workers is not None:
            return worker.address in self.workers or str(worker.name) in self.workers
        return worker.state.total_resources.get(PS_RESOURCE, 0) > 0

    def setup(self, worker: Worker) -> None:
        if not self.hosts_server(worker):
            return
        host = get_address_host(worker.address)
        self._server, port = create_server(host_port(host, 0), token=self.token, checkpoint_dir=self.checkpoint_dir)
        self.address = host_port(host, port)

    async def teardown(self, worker: Worker) -> None:
        server, self._server, self.address = self._server, None, None
        if server is None:
            return
        stopped = server.stop(STOP_GRACE_S)
        # Wait off the worker's event loop, so that the worker keeps answering the scheduler meanwhile.
        await asyncio.to_thread(stopped.wait, STOP_DEADLINE_S)
        await asyncio.to_thread(close_servicer, server)


def server_address(job_id: str, dask_worker: Worker) -> str | None:
    """The ``host:port`` of job ``job_id``'s server on this worker, or None; run on workers by ``client.run``."""
    plugin = dask_worker.plugins.get(plugin_name(job_id))
    return plugin.address if isinstance(plugin, ParameterServerPlugin) else None
