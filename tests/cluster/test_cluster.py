"""``Cluster`` against real LocalClusters: roles, devices, hosted parameter servers, and nothing left running.

One LocalCluster (1 PS, 2 workers) serves most tests; tests that change roles
work on a second ``Cluster`` over the same client (``from_client``), so the
shared one keeps its roles. Every wait has a deadline.
"""

from __future__ import annotations

import json
import multiprocessing.resource_tracker
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import psutil
import pytest
from distributed.security import Security
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cellgraph.cluster import dask_cluster
from cellgraph.cluster.cluster import CHECK_CONNECT, Cluster, ClusterError, WorkerInfo, call_with_deadline
from cellgraph.cluster.errors import ParameterServerError
from cellgraph.cluster.ps import ParameterClient, new_token
from cellgraph.cluster.ps_plugin import server_address
from cellgraph.dataflow.errors import CellgraphError
from tests.deadlines import unless_it_hangs

TIMEOUT = 10.0  # seconds: the deadline of every call and wait below
START_TIMEOUT = 60.0  # seconds for a LocalCluster's workers to join (2 cores, shared)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    cluster = Cluster.local(workers=2, ps=1, timeout=START_TIMEOUT)
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def wrapper(cluster: Cluster) -> Iterator[Cluster]:
    """A second view of the shared cluster, whose roles a test may change; closing it leaves the cluster up."""
    view = Cluster.from_client(cluster.client)
    try:
        yield view
    finally:
        view.close()


def health(address: str) -> int:
    """The gRPC health status of the server at ``address`` (raises grpc.RpcError when nothing answers)."""
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return int(stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=TIMEOUT).status)


def wait_until_unreachable(address: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        try:
            health(address)
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.UNAVAILABLE
            return
        time.sleep(0.1)
    raise AssertionError(f"the parameter server at {address} still answers {TIMEOUT} s after it was stopped")


def children() -> dict[int, str]:
    """This process's child processes (recursively), pid -> command line."""
    found = {}
    for child in psutil.Process().children(recursive=True):
        try:
            found[child.pid] = " ".join(child.cmdline())
        except psutil.NoSuchProcess:
            pass
    return found


def children_before() -> dict[int, str]:
    # multiprocessing's resource tracker is started by the first spawned process and lives as long as this
    # process, by design: start it first, so that it counts before as well as after.
    multiprocessing.resource_tracker.ensure_running()
    return children()


def assert_no_orphans(before: dict[int, str]) -> None:
    deadline = time.monotonic() + TIMEOUT
    while True:
        left = {pid: cmd for pid, cmd in children().items() if pid not in before}
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert left == {}, f"processes outlived close(): {left}"
    assert len(children()) == len(before)


# ---------------------------------------------------------------- roles, resources, devices


def test_local_cluster_roles_are_dask_resources(cluster: Cluster) -> None:
    info = cluster.client.scheduler_info(n_workers=-1)["workers"]
    by_name = {w["name"]: (address, w) for address, w in info.items()}
    assert sorted(by_name) == ["ps-0", "worker-0", "worker-1"]
    assert by_name["ps-0"][1]["resources"] == {"ps": 1}
    assert by_name["worker-0"][1]["resources"] == {"worker": 1}
    assert all(w["host"] == "127.0.0.1" and w["nthreads"] == 1 for w in info.values())
    assert cluster.scheduler_address.startswith("tcp://127.0.0.1:")
    assert cluster.ps_workers() == [by_name["ps-0"][0]]
    assert cluster.training_workers() == [by_name["worker-0"][0], by_name["worker-1"][0]]
    rows = cluster.workers()
    assert [(w.role, w.task, w.name) for w in rows] == [
        ("ps", 0, "ps-0"),
        ("worker", 0, "worker-0"),
        ("worker", 1, "worker-1"),
    ]
    assert rows[0] == WorkerInfo(
        address=by_name["ps-0"][0],
        role="ps",
        task=0,
        name="ps-0",
        nthreads=1,
        memory_limit=by_name["ps-0"][1]["memory_limit"],
        gpus=0,
        host="127.0.0.1",
    )


# Asked of the CUDA driver itself (libcuda through ctypes), not through numba as the cluster asks, in a fresh
# process (the workers' environment) so that this one never initializes CUDA.
COUNT_GPUS = """
import ctypes, os
if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
    print(1)  # Numba's simulator presents one device
else:
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        print(0)  # no driver: no GPU
    else:
        count = ctypes.c_int(0)
        ok = cuda.cuInit(0) == 0 and cuda.cuDeviceGetCount(ctypes.byref(count)) == 0
        print(count.value if ok else 0)
"""


def gpus_here() -> int:
    """The GPUs on this machine, where the LocalCluster's workers run (with this environment)."""
    ran = subprocess.run([sys.executable, "-c", COUNT_GPUS], capture_output=True, text=True, timeout=TIMEOUT)
    assert ran.returncode == 0, ran.stderr
    return int(ran.stdout)


def test_devices_and_repr(cluster: Cluster) -> None:
    gpus = [[f"/job:worker/task:{i}/device:gpu:{k}" for k in range(gpus_here())] for i in range(2)]
    assert cluster.devices() == [
        "/job:ps/task:0/device:cpu:0",
        "/job:worker/task:0/device:cpu:0",
        *gpus[0],
        "/job:worker/task:1/device:cpu:0",
        *gpus[1],
    ]
    text = repr(cluster)
    assert text.startswith(f"<Cluster {cluster.scheduler_address} (local): ps/0 {cluster.ps_workers()[0]}, worker/0 ")
    assert cluster.dashboard_link.startswith("http://127.0.0.1:")


def test_the_dashboard_link_serves_dasks_dashboard(cluster: Cluster) -> None:
    # With the notebook extra (bokeh), the link the cluster view shows opens Dask's dashboard, not a page saying
    # "Dask needs bokeh>=3.1.0 for the dashboard".
    import urllib.request

    with urllib.request.urlopen(cluster.dashboard_link, timeout=TIMEOUT) as page:
        body = page.read().decode()
    assert page.status == 200 and "needs bokeh" not in body and "bokeh" in body.lower()


def test_local_refuses_bad_counts() -> None:
    with pytest.raises(ClusterError) as info:
        Cluster.local(workers=0, ps=1)
    assert str(info.value) == (
        "Cluster.local(workers=0, ps=1, threads_per_worker=1, gpus=None): "
        "needs workers >= 1, ps >= 0 (or 'colocated'), threads_per_worker >= 1 and gpus >= 0 (or None)"
    )
    assert isinstance(info.value, CellgraphError)


# ---------------------------------------------------------------- assign


def test_assign_overrides_resources(cluster: Cluster, wrapper: Cluster) -> None:
    ps, (first, second) = cluster.ps_workers(), cluster.training_workers()
    wrapper.assign(ps=[second], worker=[first])
    assert wrapper.ps_workers() == [second] and wrapper.training_workers() == [first]
    assert [(w.address, w.role, w.task) for w in wrapper.workers()] == [
        (second, "ps", 0),
        (first, "worker", 0),
        (ps[0], "idle", None),
    ]
    assert wrapper.devices()[:2] == ["/job:ps/task:0/device:cpu:0", "/job:worker/task:0/device:cpu:0"]
    assert len(wrapper.devices()) == 2 + gpus_here()
    wrapper.assign(ps=2)  # the first two in name order; the rest train
    assert wrapper.ps_workers() == [ps[0], first] and wrapper.training_workers() == [second]
    wrapper.assign(ps=["worker-1"])  # names work as well as addresses
    assert wrapper.ps_workers() == [second] and wrapper.training_workers() == [ps[0], first]
    assert cluster.ps_workers() == ps  # the shared view did not change


def test_assign_errors_name_the_workers(cluster: Cluster, wrapper: Cluster) -> None:
    known = ", ".join(f"{w.address} (name {w.name})" for w in sorted(cluster.workers(), key=lambda w: w.name))
    with pytest.raises(ClusterError) as info:
        wrapper.assign(ps=["tcp://10.9.9.9:1"])
    assert str(info.value) == f"assign(ps=...): no worker at tcp://10.9.9.9:1; known workers: {known}"
    with pytest.raises(ClusterError) as info:
        wrapper.assign(ps=1, worker=["nobody"])
    assert str(info.value) == f"assign(worker=...): no worker at nobody; known workers: {known}"
    with pytest.raises(ClusterError) as info:
        wrapper.assign(ps=3)
    assert str(info.value) == (
        "assign(ps=3): the cluster has 3 workers, so ps must be in [0, 3) "
        f"to leave at least one training worker; known workers: {known}"
    )
    ps = cluster.ps_workers()[0]
    with pytest.raises(ClusterError) as info:
        wrapper.assign(ps=[ps], worker=[ps])
    assert str(info.value) == f"assign: {ps} cannot be both a parameter server and a training worker"
    with pytest.raises(ClusterError) as info:
        wrapper.assign(ps=[ps, "ps-0"])
    assert str(info.value) == "assign: a worker is named twice in the same role"
    with pytest.raises(ClusterError) as info:
        wrapper.assign(ps=[ps], worker=[])
    assert str(info.value) == f"assign leaves no training worker; known workers: {known}"
    assert wrapper.ps_workers() == [ps]  # roles unchanged by refused assignments


# ---------------------------------------------------------------- parameter servers


def test_parameter_servers_serve_the_token_and_stop(cluster: Cluster, tmp_path: object) -> None:
    token = new_token()
    addresses = cluster.start_parameter_servers("job-a", token, checkpoint_dir=str(tmp_path))
    try:
        assert len(addresses) == 1 and addresses[0].startswith("127.0.0.1:")
        # Found through Dask, on the PS worker and no other.
        found = cluster.client.run(server_address, "job-a")
        assert {a: found[a] for a in found if found[a]} == {cluster.ps_workers()[0]: addresses[0]}
        assert health(addresses[0]) == health_pb2.HealthCheckResponse.SERVING
        with ParameterClient(addresses, token, timeout=TIMEOUT) as client:
            assert client.init("job-a", {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}) == 0
            np.testing.assert_array_equal(client.pull().values["w"], np.arange(6, dtype=np.float32).reshape(2, 3))
            assert client.save()  # the checkpoint directory reached the server
        with ParameterClient(addresses, "not-the-token", timeout=TIMEOUT, retries=1) as intruder:
            with pytest.raises(ParameterServerError) as info:
                intruder.pull()
        assert info.value.code == "UNAUTHENTICATED"
        assert "wrong token for this parameter server" in str(info.value)
        with pytest.raises(ClusterError) as again:
            cluster.start_parameter_servers("job-a", token)
        assert str(again.value) == (
            f"parameter servers for job 'job-a' already run at {addresses[0]}; "
            "call stop_parameter_servers('job-a') first, or use another job id"
        )
    finally:
        cluster.stop_parameter_servers("job-a")
    wait_until_unreachable(addresses[0])
    assert cluster.client.run(server_address, "job-a") == {
        a: None for a in cluster.client.scheduler_info(-1)["workers"]
    }
    with pytest.raises(ClusterError) as info:
        cluster.stop_parameter_servers("job-a")
    assert str(info.value) == "no parameter servers of job 'job-a' were started here; running jobs: none"


def test_a_ctrl_c_to_the_worker_processes_leaves_them_and_their_servers_running(cluster: Cluster) -> None:
    # A notebook's interrupt sends SIGINT to the kernel's whole process group, Cluster.local's worker processes
    # included: they ignore it (worker_signals.py), so interrupting a cell that waits for a job kills nothing.
    import os

    token = new_token()
    addresses = cluster.start_parameter_servers("job-sigint", token)
    try:
        pids = cluster.client.run(os.getpid)
        assert len(pids) == 3
        for pid in pids.values():
            os.kill(pid, signal.SIGINT)
        time.sleep(1.0)  # time for a KeyboardInterrupt to end a worker, as it did
        assert all(psutil.pid_exists(pid) for pid in pids.values())
        assert cluster.client.run(os.getpid) == pids  # the same processes, none restarted by its nanny
        assert health(addresses[0]) == health_pb2.HealthCheckResponse.SERVING
    finally:
        cluster.stop_parameter_servers("job-sigint")


def test_parameter_servers_on_assigned_workers(cluster: Cluster, wrapper: Cluster) -> None:
    chosen = cluster.training_workers()[1]
    wrapper.assign(ps=[chosen])
    addresses = wrapper.start_parameter_servers("job-b", new_token())
    try:
        found = {a: s for a, s in cluster.client.run(server_address, "job-b").items() if s}
        assert found == {chosen: addresses[0]}
        assert health(addresses[0]) == health_pb2.HealthCheckResponse.SERVING
    finally:
        wrapper.close()  # stops the servers it started; the shared cluster stays up
    wait_until_unreachable(addresses[0])
    assert wrapper.closed and cluster.client.status == "running"
    assert len(cluster.client.scheduler_info(n_workers=-1)["workers"]) == 3


def test_start_parameter_servers_refusals(wrapper: Cluster) -> None:
    with pytest.raises(ClusterError) as info:
        wrapper.start_parameter_servers("", "token")
    assert str(info.value) == (
        "start_parameter_servers(job_id='', token=...): both must be non-empty strings "
        "(cellgraph.cluster.ps.new_token() makes a token)"
    )
    wrapper.assign(ps=0)
    with pytest.raises(ClusterError) as info:
        wrapper.start_parameter_servers("job-c", "token")
    assert str(info.value) == (
        "job 'job-c' needs a parameter-server worker and this cluster has none: start it with "
        "Cluster.local(ps=1), give workers the Dask resource 'ps', call cluster.assign(ps=...), or train with "
        "ps_placement='colocated'"
    )


# ---------------------------------------------------------------- connect, from_client


def test_connect_joins_without_owning(cluster: Cluster) -> None:
    with Cluster.connect(cluster.scheduler_address, timeout=TIMEOUT) as joined:
        assert joined.ps_workers() == cluster.ps_workers()
        assert joined.training_workers() == cluster.training_workers()
        assert repr(joined).startswith(f"<Cluster {cluster.scheduler_address} (connected): ps/0 ")
    assert repr(joined) == f"<Cluster {cluster.scheduler_address} (connected), closed>"
    joined.close()  # a second close is harmless
    assert cluster.devices()  # the scheduler it joined is still up


def test_from_client_leaves_the_client_open(cluster: Cluster) -> None:
    view = Cluster.from_client(cluster.client)
    assert view.training_workers() == cluster.training_workers()
    view.close()
    assert cluster.client.status == "running"


def test_a_scheduler_that_stops_answering_is_named_within_the_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scheduler process that is paused (SIGSTOP) fails the workers query within the deadline, not never."""
    scheduler_file = tmp_path / "scheduler.json"
    command = [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0",
               "--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(scheduler_file)]  # fmt: skip
    scheduler = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not scheduler_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert scheduler_file.exists(), f"the scheduler wrote no {scheduler_file.name} within {START_TIMEOUT} s"
        address = json.loads(scheduler_file.read_text())["address"]
        with Cluster.connect(address, timeout=TIMEOUT) as joined:
            assert joined.workers() == []
            monkeypatch.setattr(dask_cluster, "CALL_TIMEOUT_S", 1.0)  # scheduler_workers' deadline
            scheduler.send_signal(signal.SIGSTOP)
            try:
                with pytest.raises(ClusterError) as info:
                    joined.workers()
            finally:
                scheduler.send_signal(signal.SIGCONT)
            assert str(info.value) == (
                f"the Dask scheduler at {address} did not list its workers within 1 s "
                f"(stopped, overloaded or cut off?): {CHECK_CONNECT}"
            )
            monkeypatch.setattr(dask_cluster, "CALL_TIMEOUT_S", TIMEOUT)
            assert joined.workers() == []  # answering again, the same cluster works as before
    finally:
        scheduler.terminate()
        scheduler.wait(TIMEOUT)


def test_connect_to_a_closed_port_fails_with_the_reason_not_after_the_timeout() -> None:
    with socket.socket() as sock:  # a port that was free a moment ago, and that nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    address = f"tcp://127.0.0.1:{port}"
    # timeout=600: Dask alone would retry the refused port that long; the look before it says so at once.
    with pytest.raises(ClusterError) as info:
        unless_it_hangs(lambda: Cluster.connect(address, timeout=600), START_TIMEOUT, f"Cluster.connect({address!r})")
    assert str(info.value) == (
        f"could not reach the Dask scheduler at {address}: "
        f"the connection was refused: nothing listens on port {port} of 127.0.0.1"
    )


def test_connect_to_an_unknown_host_says_the_host_is_unknown() -> None:
    address = "tcp://no-such-host.invalid:8786"
    with pytest.raises(ClusterError) as info:
        unless_it_hangs(lambda: Cluster.connect(address, timeout=600), START_TIMEOUT, f"Cluster.connect({address!r})")
    message = str(info.value)
    assert message.startswith(f"could not reach the Dask scheduler at {address}: the host 'no-such-host.invalid' ")
    assert message.endswith(": check the name") and "tls" not in message.lower()


def test_connect_to_a_port_that_accepts_and_stays_silent_keeps_its_timeout(cluster: Cluster) -> None:
    """Dask's time-out covers the TCP connect only: its handshake read would wait for ever on such a port."""
    accepted: list[socket.socket] = []
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(0.2)
        address = f"tcp://127.0.0.1:{server.getsockname()[1]}"
        serving = threading.Event()

        def accept() -> None:  # takes every connection and never writes a byte
            while not serving.is_set():
                try:
                    accepted.append(server.accept()[0])
                except TimeoutError:
                    continue

        acceptor = threading.Thread(target=accept, daemon=True)
        acceptor.start()
        try:
            with pytest.raises(ClusterError) as info:
                unless_it_hangs(
                    lambda: Cluster.connect(address, timeout=1.0), START_TIMEOUT, "connect to a silent port"
                )
        finally:
            serving.set()
            acceptor.join(TIMEOUT)
            for conn in accepted:
                conn.close()
    assert accepted, "the silent server never saw a connection: the test did not test the handshake"
    assert str(info.value) == (
        f"could not reach the Dask scheduler at {address} within 1 s (the port took the connection and sent no "
        f"Dask handshake): {CHECK_CONNECT}"
    )
    # The abandoned attempt leaves Dask's shared event loop usable: the next client of this process connects.
    with Cluster.connect(cluster.scheduler_address, timeout=TIMEOUT) as joined:
        assert joined.training_workers() == cluster.training_workers()


def test_connect_to_a_tls_address_without_certificates_says_what_to_pass() -> None:
    """Not Dask's bare TypeError about an ssl_context argument the user never passed."""
    with pytest.raises(ClusterError) as info:
        Cluster.connect("tls://127.0.0.1:8786", timeout=2.0)
    assert str(info.value) == (
        "tls://127.0.0.1:8786 is a TLS address, and neither security= nor Dask's configuration gives the client "
        "certificates TLS needs: pass security=distributed.security.Security(tls_ca_file=..., tls_client_cert=..., "
        "tls_client_key=...), or set distributed.comm.tls.ca-file, distributed.comm.tls.client.cert and .key in "
        "Dask's configuration"
    )
    with pytest.raises(ClusterError, match="is a TLS address, and neither security= nor"):
        Cluster.connect("tls://127.0.0.1:8786", security=Security(), timeout=2.0)  # a Security without TLS


def test_a_call_past_its_deadline_says_so() -> None:
    release = threading.Event()  # the call returns only when the test says so: never before its deadline
    try:
        with pytest.raises(ClusterError) as info:
            call_with_deadline(
                lambda: release.wait(TIMEOUT), "count the GPUs on workers tcp://127.0.0.1:1", timeout=0.05
            )
    finally:
        release.set()
    assert str(info.value) == (
        "count the GPUs on workers tcp://127.0.0.1:1: no answer within 0.05 s; "
        "is a worker stuck (holding the GIL) or gone?"
    )


def test_a_call_that_never_returns_does_not_keep_the_process_from_exiting() -> None:
    """After its deadline the stuck call is abandoned: the process still exits (a CLI after Ctrl-C must)."""
    script = (
        "import threading\n"
        "from cellgraph.cluster.cluster import ClusterError, call_with_deadline\n"
        "try:\n"
        "    call_with_deadline(threading.Event().wait, 'wait for nothing', timeout=0.1)\n"
        "except ClusterError as err:\n"
        "    print(err)\n"
    )
    ran = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=START_TIMEOUT)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "wait for nothing: no answer within 0.1 s; is a worker stuck (holding the GIL) or gone?\n"


# ---------------------------------------------------------------- TLS, GPUs resource, no orphans


@pytest.mark.slow
def test_secure_cluster_with_gpu_resources_leaves_no_process_behind() -> None:
    before = children_before()
    cluster = Cluster.local(workers=1, ps=1, gpus=2, secure=True, timeout=START_TIMEOUT)
    try:
        assert cluster.scheduler_address.startswith("tls://127.0.0.1:")
        info = cluster.client.scheduler_info(n_workers=-1)["workers"]
        assert all(address.startswith("tls://") for address in info)
        assert {w["name"]: w["resources"] for w in info.values()} == {
            "ps-0": {"ps": 1},
            "worker-0": {"worker": 1, "GPU": 2},
        }
        assert [w.gpus for w in cluster.workers()] == [0, 2]
        assert len(children()) >= len(before) + 2  # a process per worker, at least
        addresses = cluster.start_parameter_servers("job-tls", new_token())
        assert health(addresses[0]) == health_pb2.HealthCheckResponse.SERVING
    finally:
        cluster.close()
    cluster.close()  # twice is harmless
    wait_until_unreachable(addresses[0])  # close() stopped the servers it started
    assert_no_orphans(before)


@pytest.mark.slow
def test_workers_that_do_not_start_in_time_fail_and_leave_nothing() -> None:
    before = children_before()
    with pytest.raises(ClusterError) as info:
        Cluster.local(workers=1, ps=1, timeout=0.2)
    message = str(info.value)
    assert message.startswith("Cluster.local: only ")
    assert "of 2 worker processes started within 0.2 s (" in message
    assert message.endswith("is the machine short of memory or processes? Try a larger timeout= or fewer workers")
    assert_no_orphans(before)


@pytest.mark.parametrize("timeout", [0, -1.0, float("inf"), float("nan"), "60"])
def test_local_refuses_a_timeout_that_is_not_a_positive_number_of_seconds(timeout: object) -> None:
    with pytest.raises(ClusterError) as info:
        Cluster.local(workers=1, ps=0, timeout=timeout)  # type: ignore[arg-type]
    assert str(info.value) == f"Cluster.local(timeout={timeout!r}): needs a finite number of seconds above 0"


def test_cg_cluster_is_the_cluster_and_dask_loads_only_when_asked() -> None:
    import subprocess
    import sys

    code = (
        "import sys, cellgraph as cg; before = 'distributed' in sys.modules; "
        "from cellgraph.cluster.cluster import Cluster; "
        "print(before, cg.Cluster is Cluster, 'distributed' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["False", "True", "True"]


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("nonsense", "missing port number in address 'nonsense'"),
        ("tcp://host:notaport", "invalid literal for int()"),
        ("foo://x:1", "unknown address scheme 'foo'"),
    ],
)
def test_connect_to_a_malformed_address_says_what_an_address_looks_like(address: str, why: str) -> None:
    with pytest.raises(ClusterError) as info:
        Cluster.connect(address, timeout=2.0)
    message = str(info.value)
    assert message.startswith(f"{address!r} is not a Dask scheduler address (")
    assert why in message
    assert message.endswith("): give one like tcp://host:8786 or tls://host:8786")


def test_scale_refuses_no_workers_and_clusters_it_did_not_start(cluster: Cluster) -> None:
    before = cluster.training_workers()
    with pytest.raises(ClusterError, match="scale: a cluster needs at least 1 training worker, got 0"):
        cluster.scale(0)
    view = Cluster.from_client(cluster.client)
    with pytest.raises(ClusterError, match=r"scale: not supported for connected clusters \(client, tcp://"):
        view.scale(3)
    assert cluster.training_workers() == before


@pytest.mark.slow
def test_a_script_that_starts_a_cluster_without_a_main_guard_is_told_so_before_anything_starts(
    tmp_path: Path,
) -> None:
    # Dask's worker processes import the script: unguarded, each would start a cluster of its own, and the script
    # would wait out its timeout for workers that never come.
    script = tmp_path / "unguarded.py"
    script.write_text("import cellgraph as cg\n\nwith cg.Cluster.local(workers=1, ps=0, timeout=60):\n    pass\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert (
        f'Cluster.local was called at the top level of {script} (line 3), outside `if __name__ == "__main__":`: '
        "Dask's worker processes import the script, and each would start a cluster of its own; put the code that "
        "starts the cluster under that guard (a notebook needs nothing)"
    ) in done.stderr
    assert "Cluster.local was called while a worker process" not in done.stderr  # no worker process was started
    guarded = tmp_path / "guarded.py"
    guarded.write_text(
        "import sys\nimport cellgraph as cg\n\nif '__main__' == __name__ and len(sys.argv) == 1:\n"
        "    with cg.Cluster.local(workers=1, ps=0, timeout=60) as c:\n        print(len(c.training_workers()))\n"
    )
    done = subprocess.run([sys.executable, str(guarded)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "1", done.stderr


def test_the_guard_check_says_nothing_of_a_script_it_cannot_read() -> None:
    # A worker importing the script then says why itself (refuse_a_worker_importing_the_script).
    dask_cluster.refuse_an_unguarded_script("/no/such/script.py", 3)
    dask_cluster.refuse_an_unguarded_script(None, 3)
    assert 'a script must start its cluster under `if __name__ == "__main__":`' in dask_cluster._UNGUARDED_SCRIPT
