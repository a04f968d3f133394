"""``cellgraph install-kernel``: the kernelspec it writes, and a real kernel started from it with the extension loaded."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager

from cellgraph import cli
from cellgraph.kernel_ext.kernelspec import KernelspecError, install

TIMEOUT = 120.0


def kernel_json(prefix: Path, name: str) -> dict[str, Any]:
    spec: dict[str, Any] = json.loads((prefix / "share" / "jupyter" / "kernels" / name / "kernel.json").read_text())
    return spec


def test_install_writes_a_kernelspec_that_loads_the_extension(tmp_path: Path) -> None:
    path = install(prefix=tmp_path)
    assert path == tmp_path / "share" / "jupyter" / "kernels" / "cellgraph"
    spec = kernel_json(tmp_path, "cellgraph")
    assert spec["display_name"] == "Python 3 (cellgraph)" and spec["language"] == "python"
    argv = spec["argv"]
    assert argv[0] == sys.executable and argv[-1] == "--ext=cellgraph"
    assert argv[argv.index("-m") + 1] == "ipykernel_launcher" and "{connection_file}" in argv
    assert (path / "logo-64x64.png").exists()  # the rest of ipykernel's spec comes along


def test_install_kernel_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["install-kernel", "--prefix", str(tmp_path), "--name", "cg-test", "--display-name", "cellgraph test"]
    assert cli.main(args) == 0
    where = tmp_path / "share" / "jupyter" / "kernels" / "cg-test"
    assert capsys.readouterr().out == (
        f"installed kernelspec 'cg-test' (cellgraph test) in {where}: its kernels load cellgraph at start\n"
    )
    assert kernel_json(tmp_path, "cg-test")["display_name"] == "cellgraph test"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--user", "--prefix", "/tmp/x"], "give --user or --prefix, not both"),
        (["--name", "my kernel"], "kernel name 'my kernel' is not allowed: use letters, digits, '.', '_' and '-' only"),
    ],
)
def test_install_kernel_refuses_bad_arguments(args: list[str], words: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["install-kernel", *args])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err == f"cellgraph install-kernel: error: {words}" + err.split(words, 1)[1] and err.count("\n") == 1
    assert "(see cellgraph install-kernel --help)" in err


def test_an_unwritable_prefix_says_what_to_do(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    assert cli.main(["install-kernel", "--prefix", str(blocked)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cellgraph install-kernel: error: could not write the kernelspec (")
    assert err.endswith("use --user to install for yourself, or --prefix for another folder\n")


def test_install_checks_before_writing(tmp_path: Path) -> None:
    with pytest.raises(KernelspecError, match="give --user or --prefix, not both"):
        install(user=True, prefix=tmp_path)
    assert list(tmp_path.iterdir()) == []


def execute(client: BlockingKernelClient, code: str, cell_id: str | None = None) -> tuple[str, str]:
    """Run ``code`` as a notebook would (with its cell id in the request's metadata); return (status, output text)."""
    msg = client.session.msg("execute_request", {"code": code, "silent": False, "store_history": True})
    if cell_id is not None:
        msg["metadata"]["cellId"] = cell_id  # where JupyterLab puts it
    client.shell_channel.send(msg)
    output: list[str] = []
    while True:
        reply = client.get_iopub_msg(timeout=TIMEOUT)
        if reply["parent_header"].get("msg_id") != msg["header"]["msg_id"]:
            continue
        kind, content = reply["msg_type"], reply["content"]
        if kind == "stream":
            output.append(content["text"])
        elif kind in ("execute_result", "display_data"):
            output.append(content["data"].get("text/plain", ""))
        elif kind == "error":
            output.append(f"{content['ename']}: {content['evalue']}")
        elif kind == "status" and content["execution_state"] == "idle":
            break
    status = client.get_shell_msg(timeout=TIMEOUT)["content"]["status"]
    return status, "".join(output)


@pytest.mark.slow
def test_a_kernel_from_the_kernelspec_has_the_extension_loaded(tmp_path: Path) -> None:
    install(prefix=tmp_path, name="cg-kernel")
    specs = KernelSpecManager(kernel_dirs=[str(tmp_path / "share" / "jupyter" / "kernels")])
    assert specs.get_kernel_spec("cg-kernel").display_name == "Python 3 (cellgraph)"
    manager = KernelManager(kernel_name="cg-kernel", kernel_spec_manager=specs)
    manager.start_kernel()
    try:
        client = manager.blocking_client()
        client.start_channels()
        try:
            client.wait_for_ready(timeout=TIMEOUT)
            status, out = execute(client, "%graph --help")
            assert status == "ok" and out.startswith("usage: %graph [-h] [--no-show] [NAME]"), out
            status, out = execute(client, "print('cellgraph' in get_ipython().extension_manager.loaded)")
            assert (status, out) == ("ok", "True\n")
            # ipykernel hands the front end's cell id to the extension: a re-run cell replaces its nodes.
            cell = "import cellgraph as cg\nh = cg.layers.dense(cg.placeholder((None, 4), name='x'), 2, name='d')"
            for _ in range(2):
                assert execute(client, cell, cell_id="cell-1")[0] == "ok"
            status, out = execute(
                client, "print([n.name for n in cg.get_default_graph().nodes], list(cg.get_default_graph().cells))"
            )
            assert (status, out) == ("ok", "['x', 'd/kernel', 'd/matmul', 'd/bias', 'd/bias_add'] ['cell-1']\n")
        finally:
            client.stop_channels()
    finally:
        manager.shutdown_kernel(now=True)
