"""Regenerate the Python modules of every ``protos/*.proto``; ``--check`` verifies them.

    python protos/generate.py           # rewrite protos/*_pb2.py and *_pb2.pyi
    python protos/generate.py --check   # exit 1, naming each stale file, when they differ

Each ``x.proto`` gives ``x_pb2.py`` and its stub ``x_pb2.pyi`` (mypy-protobuf);
one that declares a ``service`` also gives ``x_pb2_grpc.py`` and
``x_pb2_grpc.pyi``. The .proto files are compiled under the virtual path
``cellgraph/protos/`` (so they import one another as
``import "cellgraph/protos/tensor.proto";`` and register in protobuf's global
descriptor pool under names no other library uses), and the generated absolute
imports are rewritten into package-relative ones (``from . import tensor_pb2``).

The committed modules were generated with grpcio-tools 1.85.1 (libprotoc 35.1,
protobuf Python gencode 7.35.1: they need protobuf >= 7.35.1 at run time, and
the gRPC stubs grpcio >= 1.85.1) and mypy-protobuf 5.1.0. Other versions write
different text, so ``--check`` names the versions when it finds a difference.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.resources
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from google.protobuf import descriptor_pb2

PROTOS_DIR = Path(__file__).resolve().parent
VIRTUAL_DIR = "cellgraph/protos"
GENERATED_WITH = {"grpcio-tools": "1.85.1", "mypy-protobuf": "5.1.0"}
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


class GenerateError(Exception):
    """protoc or a plugin is missing or failed; the message says which and why."""


def _plugin(name: str, package: str) -> str:
    """The path of protoc plugin ``name``, installed by pip package ``package``."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        version = GENERATED_WITH[package]
        raise GenerateError(f"protoc plugin {name} not found: pip install {package}=={version}")
    return found


def _protoc(args: list[str]) -> None:
    well_known = importlib.resources.files("grpc_tools") / "_proto"
    command = [sys.executable, "-m", "grpc_tools.protoc", f"-I{VIRTUAL_DIR}={PROTOS_DIR}", f"-I{well_known}", *args]
    result = subprocess.run(command, capture_output=True, text=True, check=False)  # noqa: S603 - our own argv
    if result.returncode != 0:
        raise GenerateError(f"protoc failed (exit {result.returncode}):\n{result.stderr.strip()}")


def _with_services(descriptor_set: Path) -> list[str]:
    """The .proto files (virtual paths) that declare at least one service."""
    files = descriptor_pb2.FileDescriptorSet.FromString(descriptor_set.read_bytes())
    return [f.name for f in files.file if f.service]


def _relative_imports(text: str, modules: set[str]) -> str:
    """Rewrite ``import x_pb2 as y`` / ``from cellgraph.protos import x_pb2 as y``
    of our own modules into ``from . import x_pb2 as y``."""

    def relative(match: re.Match[str]) -> str:
        module, alias = match.group("module"), match.group("alias")
        if module not in modules:
            return match.group(0)
        return f"from . import {module}" + (f" as {alias}" if alias else "")

    pattern = r"^(?:import|from cellgraph\.protos import) (?P<module>\w+)(?: as (?P<alias>\w+))?$"
    return re.sub(pattern, relative, text, flags=re.MULTILINE)


def generate(out_dir: Path) -> dict[str, str]:
    """Generate the modules of every protos/*.proto under ``out_dir``; return {file name: text}."""
    protos = sorted(f"{VIRTUAL_DIR}/{p.name}" for p in PROTOS_DIR.glob("*.proto"))
    if not protos:
        return {}
    descriptors = out_dir / "descriptors.pb"
    mypy = _plugin("protoc-gen-mypy", "mypy-protobuf")
    _protoc([
        f"--descriptor_set_out={descriptors}",
        f"--python_out={out_dir}",
        f"--plugin=protoc-gen-mypy={mypy}",
        f"--mypy_out={out_dir}",
        *protos,
    ])  # fmt: skip
    services = _with_services(descriptors)
    if services:
        mypy_grpc = _plugin("protoc-gen-mypy_grpc", "mypy-protobuf")
        _protoc([
            f"--grpc_python_out={out_dir}",
            f"--plugin=protoc-gen-mypy_grpc={mypy_grpc}",
            f"--mypy_grpc_out={out_dir}",
            *services,
        ])  # fmt: skip
    generated = sorted((out_dir / VIRTUAL_DIR).iterdir())
    modules = {p.name.split(".")[0] for p in generated}
    return {p.name: _relative_imports(p.read_text(), modules) for p in generated}


def _committed() -> set[str]:
    return {p.name for p in PROTOS_DIR.iterdir() if p.name.endswith(GENERATED_SUFFIXES)}


def _differences(expected: dict[str, str]) -> list[str]:
    """One line per committed file that is not what the .proto files generate."""
    problems = []
    for name, text in expected.items():
        path = PROTOS_DIR / name
        if not path.exists():
            problems.append(f"protos/{name} is missing")
        elif path.read_text() != text:
            problems.append(f"protos/{name} is stale: it differs from what its .proto generates")
    for name in sorted(_committed() - set(expected)):
        problems.append(f"protos/{name} is left over: no .proto (or no service) generates it")
    return problems


def _version_note() -> str:
    notes = []
    for package, wanted in GENERATED_WITH.items():
        try:
            have = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            have = "not installed"
        if have != wanted:
            notes.append(f"{package} {have} (the committed code was generated with {wanted})")
    if not notes:
        return ""
    return "note: installed " + "; ".join(notes) + ", which may explain the difference\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="only verify that the committed code is up to date")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="cellgraph-protos-") as tmp:
        try:
            expected = generate(Path(tmp))
        except GenerateError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    problems = _differences(expected)
    if args.check:
        if problems:
            print("\n".join(problems), file=sys.stderr)
            print(f"{_version_note()}run: python protos/generate.py", file=sys.stderr)
            return 1
        print(f"protos: {len(expected)} generated files are up to date")
        return 0
    for name, text in expected.items():
        path = PROTOS_DIR / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote protos/{name}")
    for name in sorted(_committed() - set(expected)):
        (PROTOS_DIR / name).unlink()
        print(f"removed protos/{name} (no .proto generates it any more)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
