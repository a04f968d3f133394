"""A shell command run while the parameter service is busy comes back whole (grpc/grpc#43055).

Each case runs in a fresh interpreter: gRPC reads ``GRPC_ENABLE_FORK_SUPPORT``
once, at its first import, so only a new process shows what a user's gets.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

# A server, a client whose held stream pulls in a loop on another thread, and 60 `!echo hi`s through pexpect (what
# IPython's `!cmd` uses: a pty fork whose child closes its inherited descriptors before exec). With gRPC's fork
# handlers on, about one in four died or printed an epoll_wait error here.
FORK_STORM = textwrap.dedent(
    """
    import threading
    import numpy as np
    import pexpect
    from cellgraph.cluster.ps import OptimizerConfig, ParameterClient, create_server

    server, port = create_server("127.0.0.1:0", token="t")
    client = ParameterClient([f"127.0.0.1:{port}"], token="t")
    client.init("job", {"w": np.ones((64, 64), np.float32)}, OptimizerConfig("sgd", learning_rate=0.1))
    stop = threading.Event()
    pulls = []

    def busy():
        while not stop.is_set():
            pulls.append(client.pull().global_step)

    thread = threading.Thread(target=busy)
    thread.start()
    bad = []
    for _ in range(60):
        out, status = pexpect.run("echo hi", encoding="utf-8", withexitstatus=True, timeout=30)
        if status != 0 or out.strip() != "hi":
            bad.append((status, out))
    stop.set()
    thread.join(30)
    client.close()
    server.stop(None).wait(30)
    print(len(pulls) > 0, bad)
    """
)


def run_python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=240)


def environment_without_the_variable() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}


def test_shell_commands_forked_while_a_client_pulls_all_come_back_whole() -> None:
    done = run_python(FORK_STORM, environment_without_the_variable())
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "True []"


def test_the_parameter_service_leaves_a_users_own_setting_alone() -> None:
    code = "import os, cellgraph.cluster.ps; print(os.environ['GRPC_ENABLE_FORK_SUPPORT'])"
    own = run_python(code, {**environment_without_the_variable(), "GRPC_ENABLE_FORK_SUPPORT": "1"})
    ours = run_python(code, environment_without_the_variable())
    assert (own.stdout.strip(), ours.stdout.strip()) == ("1", "false")


def test_grpc_imported_first_is_warned_about_with_the_fix() -> None:
    done = run_python(
        "import grpc, warnings; warnings.simplefilter('always'); import cellgraph.cluster.ps",
        environment_without_the_variable(),
    )
    assert "grpc was imported before cellgraph's parameter service, with GRPC_ENABLE_FORK_SUPPORT unset" in done.stderr
    assert "Set GRPC_ENABLE_FORK_SUPPORT=false before anything imports grpc." in done.stderr
