"""Hosts on one machine: Linux network namespaces joined by veth pairs to one bridge, for tests and benchmarks.

Each role (``scheduler``, ``ps``, ``worker0``...) gets its own namespace and
address (10.77.x.y), as on separate machines; ``shape`` puts ``tc netem`` on a
host's outgoing link (a rate and a one-way delay), so a benchmark can rehearse
a real network. It needs root (CAP_NET_ADMIN) and iproute2;
``cannot_make_namespaces()`` says why not where it cannot.

``dask_cluster(hosts, workers)`` starts Dask's own scheduler and workers in
them (a ``ps`` worker with the Dask resource ``ps``), as a multi-machine
deployment does.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cellgraph.cluster.cluster import Cluster

SCHEDULER_PORT = 8786


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``ip ARGS`` with a deadline; raises on failure unless ``check`` is false."""
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)  # noqa: S603, S607


@dataclass
class Hosts:
    """Namespaces on one bridge, and the processes started in them."""

    tag: str = field(default_factory=lambda: secrets.token_hex(2))
    subnet: str = ""
    namespaces: dict[str, str] = field(default_factory=dict)  # role -> namespace
    addresses: dict[str, str] = field(default_factory=dict)  # role -> IP
    links: dict[str, str] = field(default_factory=dict)  # role -> root-side veth
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def bridge(self) -> str:
        return f"cgbr{self.tag}"

    def create(self, roles: list[str]) -> None:
        self.subnet = f"10.77.{int(self.tag, 16) % 250}"
        ip("link", "add", self.bridge, "type", "bridge")
        ip("addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        for i, role in enumerate(roles):
            ns, outside = f"cg-{self.tag}-{role}", f"cgv{self.tag}{i}"
            ip("netns", "add", ns)
            self.namespaces[role] = ns
            ip("link", "add", outside, "type", "veth", "peer", "name", "eth0", "netns", ns)
            self.links[role] = outside
            ip("link", "set", outside, "master", self.bridge)
            ip("link", "set", outside, "up")
            self.addresses[role] = f"{self.subnet}.{10 + i}"
            ip("-n", ns, "addr", "add", f"{self.addresses[role]}/24", "dev", "eth0")
            ip("-n", ns, "link", "set", "eth0", "up")
            ip("-n", ns, "link", "set", "lo", "up")

    def shape(self, role: str, rate: str, delay: str) -> str | None:
        """Every packet ``role`` sends leaves at most at ``rate`` (``"1gbit"``) and arrives ``delay`` later.

        Where the kernel has no ``netem`` queueing discipline (a kernel built
        without ``sch_netem``), only the rate is applied, with ``tbf``: the
        return value then says why the delay is missing (None when applied).
        """
        qdisc = ["tc", "qdisc", "replace", "dev", "eth0", "root"]
        tried = ip("netns", "exec", self.namespaces[role], *qdisc, "netem", "rate", rate, "delay", delay, check=False)
        if tried.returncode == 0:
            return None
        # tbf: a bucket of a few packets' worth at the rate, and at most 10 ms of queue.
        ip("netns", "exec", self.namespaces[role], *qdisc, "tbf", "rate", rate, "burst", "64kb", "latency", "10ms")
        return f"tc netem is not available here ({tried.stderr.strip()}): the rate is applied with tbf, no delay"

    def run(self, role: str, *argv: str, env: dict[str, str] | None = None) -> None:
        command = ["ip", "netns", "exec", self.namespaces[role], *argv]
        self.processes.append(
            subprocess.Popen(  # noqa: S603, S607 - our own argv
                command,
                env={**os.environ, **(env or {})},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
        )

    def cut(self, role: str) -> None:
        """Take a host off the network: its link goes down, its processes keep running."""
        ip("link", "set", self.links[role], "down")

    def destroy(self) -> None:
        for proc in self.processes:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        for ns in self.namespaces.values():
            ip("netns", "del", ns, check=False)
        for link in self.links.values():
            ip("link", "del", link, check=False)
        ip("link", "del", self.bridge, check=False)


def cannot_make_namespaces() -> str | None:
    """Why network namespaces cannot be made here, or None when they can."""
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    if os.geteuid() != 0:
        return "creating network namespaces needs root (CAP_NET_ADMIN)"
    probe = f"cg-probe-{secrets.token_hex(2)}"
    made = ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed here: {made.stderr.strip()}"
    ip("netns", "del", probe, check=False)
    return None


@contextmanager
def dask_cluster(workers: int = 2) -> Iterator[Hosts]:
    """A scheduler, a ``ps`` worker and ``workers`` training workers, each on its own host; torn down at the end."""
    hosts = Hosts()
    try:
        hosts.create(["scheduler", "ps", *(f"worker{i}" for i in range(workers))])
        scheduler = f"tcp://{hosts.addresses['scheduler']}:{SCHEDULER_PORT}"
        # A lost worker is noticed in seconds, not the default five minutes.
        ttl = {"DASK_DISTRIBUTED__SCHEDULER__WORKER_TTL": "5s"}
        python = sys.executable
        hosts.run("scheduler", python, "-m", "distributed.cli.dask_scheduler", "--host",
                  hosts.addresses["scheduler"], "--port", str(SCHEDULER_PORT), "--dashboard-address", ":0",
                  env=ttl)  # fmt: skip
        roles = [("ps", "ps=1", "ps-0"), *((f"worker{i}", "worker=1", f"worker-{i}") for i in range(workers))]
        for role, resource, name in roles:
            hosts.run(role, python, "-m", "distributed.cli.dask_worker", scheduler, "--host", hosts.addresses[role],
                      "--nthreads", "1", "--resources", resource, "--name", name, "--dashboard-address", ":0")  # fmt: skip
        yield hosts
    finally:
        hosts.destroy()


def scheduler_address(hosts: Hosts) -> str:
    return f"tcp://{hosts.addresses['scheduler']}:{SCHEDULER_PORT}"


def connect(hosts: Hosts, workers: int, timeout: float) -> Cluster:
    """A ``Cluster`` on ``dask_cluster``'s scheduler once it answers and ``workers`` workers joined, within
    ``timeout`` seconds (its processes start in the background)."""
    from cellgraph.cluster.cluster import Cluster, ClusterError

    deadline = time.monotonic() + timeout
    while True:
        try:
            cluster = Cluster.connect(scheduler_address(hosts), timeout=5)
            break
        except ClusterError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    try:
        cluster.client.wait_for_workers(workers, timeout=max(1.0, deadline - time.monotonic()))
    except BaseException:
        cluster.close()
        raise
    return cluster
