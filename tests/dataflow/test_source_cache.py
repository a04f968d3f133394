"""A kernel's cache follows the helpers it inlines from other files (dataflow/kernels/source_cache.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from cellgraph.dataflow.kernels import cpu
from cellgraph.dataflow.kernels.source_cache import cache_folder, sources_digest

HELPER = """
from numba import njit


@njit(inline="always", cache=True)
def value():
    return {value}
"""

KERNEL = """
from pathlib import Path

from numba import njit

from cellgraph.dataflow.kernels.source_cache import numba_cache_for
from pkg.helper import value

with numba_cache_for(Path(__file__).parent):
    @njit(cache=True)
    def kernel():
        return value()
"""


def _run(root: Path) -> float:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(root / "cache"), "PYTHONPATH": str(root)}
    child = "from pkg.kernel import kernel; print(kernel())"
    done = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return float(done.stdout.strip())


def test_a_kernel_sees_a_change_to_a_helper_in_another_file(tmp_path: Path) -> None:
    # Numba keys a cached kernel by its own file: with cache=True alone, the second run printed 1.0 again.
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "kernel.py").write_text(KERNEL)
    (package / "helper.py").write_text(HELPER.format(value=1.0))
    assert _run(tmp_path) == 1.0
    assert _run(tmp_path) == 1.0  # loaded from its cache
    (package / "helper.py").write_text(HELPER.format(value=2.0))
    assert _run(tmp_path) == 2.0
    folders = sorted(p.name for p in (tmp_path / "cache").iterdir() if p.name.startswith("kernels-pkg-"))
    assert len(folders) == 2, folders  # one a version of the package's sources


def test_cellgraphs_kernels_cache_by_the_digest_of_their_folder() -> None:
    folder = cache_folder(cpu.SOURCES)
    assert folder is not None and folder.name == f"kernels-cpu-{sources_digest(cpu.SOURCES)}"
    assert any(folder.rglob("*.nbi")), "the kernels this process compiled or loaded are indexed there"
