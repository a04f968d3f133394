"""The committed protobuf modules are what ``protos/generate.py`` makes from the .proto files."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

PROTOS = Path(__file__).resolve().parent.parent / "protos"


def _check(protos_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(protos_dir / "generate.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_generated_code_is_up_to_date() -> None:
    result = _check(PROTOS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "up to date" in result.stdout


def test_check_names_stale_missing_and_left_over_files(tmp_path: Path) -> None:
    copy = tmp_path / "protos"
    shutil.copytree(PROTOS, copy, ignore=shutil.ignore_patterns("__pycache__"))
    with (copy / "graph_pb2.py").open("a") as f:
        f.write("# edited by hand\n")
    (copy / "tensor_pb2.pyi").unlink()
    (copy / "old_pb2.py").write_text("")
    result = _check(copy)
    assert result.returncode == 1
    assert "protos/graph_pb2.py is stale" in result.stderr
    assert "protos/tensor_pb2.pyi is missing" in result.stderr
    assert "protos/old_pb2.py is left over" in result.stderr
    assert "run: python protos/generate.py" in result.stderr


def test_generated_modules_import_as_a_package() -> None:
    from cellgraph.protos import graph_pb2, tensor_pb2

    node = graph_pb2.NodeDef(name="x", output=[tensor_pb2.TensorSpecProto(dtype=tensor_pb2.DT_FLOAT32)])
    assert graph_pb2.DESCRIPTOR.name == "cellgraph/protos/graph.proto"
    assert graph_pb2.NodeDef.FromString(node.SerializeToString()) == node
