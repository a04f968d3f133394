"""gRPC's classic I/O path is chosen before grpc is imported, only where measured, never over the user's own setting.

The process-level cases run in a fresh interpreter: gRPC reads
``GRPC_EXPERIMENTS`` when it is first imported, so only a new process shows
what a user's gets.
"""

from __future__ import annotations

import os
import subprocess
import sys

import grpc

from cellgraph.cluster.ps import grpc_io

PRINT_SETTING = "import os, cellgraph.cluster.ps; print(os.environ.get('GRPC_EXPERIMENTS'))"


def run_python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=240)


def environment_without_the_variable() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != grpc_io.VARIABLE}


def test_importing_the_parameter_service_chooses_the_classic_path_on_a_measured_grpcio() -> None:
    done = run_python(PRINT_SETTING, environment_without_the_variable())
    assert done.returncode == 0, done.stderr
    expected = grpc_io.CLASSIC_IO if grpc_io._major_minor(grpc.__version__) in grpc_io.MEASURED else "None"
    assert done.stdout.strip() == expected
    assert "Unknown experiment" not in done.stderr  # gRPC knew every name it was given


def test_a_users_own_setting_is_left_alone() -> None:
    done = run_python(PRINT_SETTING, {**environment_without_the_variable(), grpc_io.VARIABLE: "-event_engine_dns"})
    assert done.stdout.strip() == "-event_engine_dns"


def test_nothing_is_set_once_grpc_is_imported_or_on_a_grpcio_not_measured() -> None:
    late = run_python(
        "import os, grpc, cellgraph.cluster.ps; print(os.environ.get('GRPC_EXPERIMENTS'))",
        environment_without_the_variable(),
    )
    assert late.stdout.strip() == "None"
    assert grpc_io.setting({}, "1.85.1", grpc_imported=True) is None
    assert grpc_io.setting({}, "1.99.0", grpc_imported=False) is None
    assert grpc_io.setting({}, "2.0", grpc_imported=False) is None
    assert grpc_io.setting({}, "not a version", grpc_imported=False) is None
    assert grpc_io.setting({}, None, grpc_imported=False) is None
    assert grpc_io.setting({}, "1.85.3", grpc_imported=False) == grpc_io.CLASSIC_IO


def test_a_held_stream_step_works_on_the_chosen_path_in_a_fresh_process() -> None:
    # The whole parameter service over the classic path: init, a push and pull on the held stream, a health check.
    code = (
        "import os, numpy as np\n"
        "from cellgraph.cluster.ps import OptimizerConfig, ParameterClient, create_server\n"
        "server, port = create_server('127.0.0.1:0', token='t')\n"
        "client = ParameterClient([f'127.0.0.1:{port}'], token='t')\n"
        "client.init('job', {'w': np.ones(4, np.float32)}, OptimizerConfig('sgd', learning_rate=0.5))\n"
        "client.register(0)\n"
        "pushed, pulled = client.push_pull({'w': np.ones(4, np.float32)}, step=0, replica_id=0)\n"
        "print(os.environ.get('GRPC_EXPERIMENTS') is not None, pushed.status, pulled.values['w'].tolist())\n"
        "client.close(); server.stop(None).wait(30)\n"
    )
    done = run_python(code, environment_without_the_variable())
    assert done.returncode == 0, done.stderr
    on_classic = grpc_io._major_minor(grpc.__version__) in grpc_io.MEASURED
    assert done.stdout.strip() == f"{on_classic} applied [0.5, 0.5, 0.5, 0.5]"
