"""Multi-host on one machine: a scheduler, a PS and two workers, each in its own network namespace.

Linux network namespaces joined by veth pairs to one bridge give every process
its own address (10.77.x.y), as on separate machines; only the test's own
addresses are used. Training runs across them; then one worker's link is cut
mid-job and the job goes on with the rest. This is the rehearsal for a real
multi-machine cluster. It needs root (CAP_NET_ADMIN) and iproute2; where the
test cannot create namespaces it is skipped, saying why.
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
from dataclasses import dataclass, field

import pytest

import cellgraph as cg
from cellgraph.cluster.cluster import Cluster
from cellgraph.examples import digits, models

START_S = 60.0
TIMEOUT_S = 180.0


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


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
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, role in enumerate(roles):
            ns, outside = f"cg-{self.tag}-{role}", f"cgv{self.tag}{i}"
            _ip("netns", "add", ns)
            self.namespaces[role] = ns
            _ip("link", "add", outside, "type", "veth", "peer", "name", "eth0", "netns", ns)
            self.links[role] = outside
            _ip("link", "set", outside, "master", self.bridge)
            _ip("link", "set", outside, "up")
            self.addresses[role] = f"{self.subnet}.{10 + i}"
            _ip("-n", ns, "addr", "add", f"{self.addresses[role]}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    def run(self, role: str, *argv: str, env: dict[str, str] | None = None) -> None:
        command = ["ip", "netns", "exec", self.namespaces[role], *argv]
        self.processes.append(
            subprocess.Popen(  # noqa: S603 - our own argv
                command,
                env={**os.environ, **(env or {})},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
        )

    def cut(self, role: str) -> None:
        """Take a host off the network: its link goes down, its processes keep running."""
        _ip("link", "set", self.links[role], "down")

    def destroy(self) -> None:
        for proc in self.processes:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        for ns in self.namespaces.values():
            _ip("netns", "del", ns, check=False)
        for link in self.links.values():
            _ip("link", "del", link, check=False)
        _ip("link", "del", self.bridge, check=False)


def _cannot_make_namespaces() -> str | None:
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    if os.geteuid() != 0:
        return "creating network namespaces needs root (CAP_NET_ADMIN)"
    probe = f"cg-probe-{secrets.token_hex(2)}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed here: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


@pytest.fixture(scope="module")
def hosts() -> Iterator[Hosts]:
    why = _cannot_make_namespaces()
    if why:
        pytest.skip(f"no network namespaces: {why}")
    hosts = Hosts()
    try:
        hosts.create(["scheduler", "ps", "worker0", "worker1"])
        scheduler = f"tcp://{hosts.addresses['scheduler']}:8786"
        # A lost worker is noticed in seconds, not the default five minutes.
        ttl = {"DASK_DISTRIBUTED__SCHEDULER__WORKER_TTL": "5s"}
        python = sys.executable
        hosts.run("scheduler", python, "-m", "distributed.cli.dask_scheduler", "--host",
                  hosts.addresses["scheduler"], "--port", "8786", "--dashboard-address", ":0", env=ttl)  # fmt: skip
        for role, resource, name in (
            ("ps", "ps=1", "ps-0"),
            ("worker0", "worker=1", "worker-0"),
            ("worker1", "worker=1", "worker-1"),
        ):
            hosts.run(role, python, "-m", "distributed.cli.dask_worker", scheduler, "--host", hosts.addresses[role],
                      "--nthreads", "1", "--resources", resource, "--name", name, "--dashboard-address", ":0")  # fmt: skip
        yield hosts
    finally:
        hosts.destroy()


@pytest.mark.slow
def test_training_runs_across_hosts_and_survives_a_cut_link(hosts: Hosts) -> None:
    scheduler = f"tcp://{hosts.addresses['scheduler']}:8786"
    deadline = time.monotonic() + START_S
    cluster = None
    while cluster is None:
        try:
            cluster = Cluster.connect(scheduler, timeout=5)
        except cg.ClusterError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    try:
        cluster.client.wait_for_workers(3, timeout=START_S)
        workers = {w.address.split("//")[1].split(":")[0]: w.role for w in cluster.workers()}
        assert workers == {
            hosts.addresses["ps"]: "ps",
            hosts.addresses["worker0"]: "worker",
            hosts.addresses["worker1"]: "worker",
        }
        data = digits.load()
        model = models.mlp()
        job = cg.train(
            model.loss, (data.x_train, data.y_train), cluster=cluster, optimizer=cg.optim.Adam(1e-2),
            replicas=2, replicas_to_aggregate=1, batch_size=32, steps=600, checkpoint_every=None,
        )  # fmt: skip
        try:
            # Every process has its own address: the PS answers on the PS host's.
            assert all(a.startswith(hosts.addresses["ps"] + ":") for a in job._ps.addresses)  # type: ignore[union-attr]
            start = time.monotonic()
            while job.global_step() < 100:
                assert time.monotonic() - start < TIMEOUT_S, "the job did not reach step 100"
                time.sleep(0.2)
            hosts.cut("worker1")
            job.wait(TIMEOUT_S)
            assert job.status == "finished" and job.global_step() == 600
            logits = job.evaluate(model.logits, {model.x: data.x_test})
            assert (logits.argmax(axis=1) == data.y_test).mean() >= 0.9
        finally:
            job.close()
    finally:
        cluster.close()
