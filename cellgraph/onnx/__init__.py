"""ONNX out and in: ``cg.onnx.export`` writes a trained model, ``cg.onnx.import_model`` reads one.

The ``onnx`` package is imported only when one of these runs (``pip install 'cellgraph[onnx]'``).

Examples
--------
>>> import os, tempfile
>>> import numpy as np
>>> import cellgraph as cg
>>> g = cg.Graph()
>>> with g.as_default():
...     x = cg.placeholder((None, 3), name="x")
...     y = cg.relu(cg.layers.dense(x, 2, name="dense"), name="y")
>>> session = cg.Session(g)
>>> with tempfile.TemporaryDirectory() as d:
...     _ = cg.onnx.export(os.path.join(d, "m.onnx"), x, y, session)
...     back = cg.onnx.import_model(os.path.join(d, "m.onnx"))
>>> data = np.ones((2, 3), np.float32)
>>> bool(np.allclose(back(data), session.run(y, {x: data})))
True
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from .common import OnnxError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from cellgraph.dataflow.graph import Tensor

    from .importer import ImportedModel

INSTALL_HINT = "ONNX export and import need the onnx extra: pip install 'cellgraph[onnx]'"


def _need_onnx() -> None:
    try:
        import onnx  # noqa: F401
    except ImportError as err:
        raise OnnxError(f"{INSTALL_HINT} ({err})") from err


def export(
    path: str | Path,
    inputs: Tensor | Sequence[Tensor],
    outputs: Tensor | Sequence[Tensor],
    source: Any,
    opset: int = 17,
    bfloat16: str = "float32",
) -> Any:
    """Write the ONNX model of ``outputs`` fed by ``inputs``, with ``source``'s trained values; see ``exporter.export``."""
    _need_onnx()
    from .exporter import export as run

    return run(path, inputs, outputs, source, opset, bfloat16)


def import_model(
    path: str | Path | Any, static_inputs: dict[str, Any] | None = None, examples: dict[str, Any] | None = None
) -> ImportedModel:
    """A cellgraph graph built from an ONNX model, its initializers as variables; see ``importer.import_model``."""
    _need_onnx()
    from .importer import import_model as run

    return run(path, static_inputs, examples)


__all__ = ["OnnxError", "export", "import_model"]


def __dir__() -> list[str]:
    """What ``cg.onnx.<Tab>`` offers: its public names, not the modules and types it imports for itself."""
    return sorted(__all__)
