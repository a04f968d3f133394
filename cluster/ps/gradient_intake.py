"""A push's gradients taken in at the server's door, chunk by chunk, before the store sees the push.

Every RPC that carries a push (``Step``, ``Push``, ``PushPull``) hands each
chunk here: an ordinary chunk is written into its gradient's own buffer
(made at the gradient's first chunk); a fused chunk (``fused.py``) is checked
whole and each of its members taken as it lies. A gradient is checked for
NaN and Inf as soon as it is whole, while the rest of the push is still on
the wire, unless the replica checked the whole push itself
(``PushHeader.checked``). Nothing reaches the store until the push is whole
(``ParameterServicer.push``).

Examples
--------
>>> import numpy as np
>>> from cellgraph.protos import parameter_service_pb2 as pb
>>> from .chunks import tensor_chunks
>>> from .config import OptimizerConfig, TrainingConfig, VariableSpec
>>> from .store import ParameterStore
>>> spec = VariableSpec("w", np.dtype("float32"), (3,))
>>> store = ParameterStore("job", [spec], {"w": np.zeros(3, np.float32)}, OptimizerConfig(), TrainingConfig())
>>> [chunk] = tensor_chunks("w", np.ones(3, np.float32))
>>> assemblers = {}
>>> take_gradient(store, pb.PushHeader(replica_id=0, step=0), chunk, memoryview(chunk.content), assemblers, 1 << 20)
12
>>> assemblers["w"].finish(), assemblers["w"].finite
(array([1., 1., 1.], dtype=float32), True)
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

import numpy as np

from cellgraph.protos import parameter_service_pb2 as pb
from cellgraph.protos import tensor_pb2

from ...dataflow.kernels.cpu.training import all_finite
from ..errors import ParameterServerError
from . import fused
from .chunks import TensorAssembler
from .config import listed, quoted
from .door import check_chunk_size
from .pieces import parts

if TYPE_CHECKING:
    from .store import ParameterStore

# The fused layouts each store's pushes were checked against (fused.checked's ``layouts``): a store's specs never
# change, and a replica sends the same groups step after step. Weak: a store replaced by a new Init goes.
_LAYOUTS: weakref.WeakKeyDictionary[ParameterStore, dict[tuple[tuple[str, ...], int], fused.FusedLayout]] = (
    weakref.WeakKeyDictionary()
)


def take_gradient(
    store: ParameterStore,
    header: pb.PushHeader,
    chunk: tensor_pb2.TensorChunk,
    content: memoryview,
    assemblers: dict[str, Taken],
    max_chunk_bytes: int,
) -> int:
    """Take one chunk of a push into ``assemblers`` (by gradient name); the bytes taken."""
    if chunk.members:
        _take_fused(store, header, chunk, content, assemblers, max_chunk_bytes)
        return content.nbytes
    assembler = assemblers.get(chunk.name)
    if isinstance(assembler, WholeGradient):  # it came whole in a fused chunk already
        raise ParameterServerError(f"gradient for {quoted(chunk.name)} arrived a second time", "INVALID_ARGUMENT")
    if assembler is None:
        spec = store.specs.get(chunk.name)
        if spec is None:
            raise ParameterServerError(
                f"gradient for unknown variable {quoted(chunk.name)} in replica {header.replica_id}'s push "
                f"for step {header.step}; this shard holds: {listed(store.specs, quote=False)}",
                "NOT_FOUND",
            )
        what = f"gradient for {quoted(chunk.name)}"
        assembler = assemblers[chunk.name] = TensorAssembler(spec, what, adopt=True, pieces=True)
    if content.nbytes > max_chunk_bytes:  # the message made only when it is needed
        check_chunk_size(content.nbytes, max_chunk_bytes, f"gradient for {quoted(chunk.name)}")
    assembler.add(chunk, content)
    if assembler.received == assembler.total and store.training.nonfinite != "apply":
        assembler.finite = header.checked or all(all_finite(piece) for _, piece in parts(assembler.gradient()))
    return content.nbytes


def _take_fused(
    store: ParameterStore,
    header: pb.PushHeader,
    chunk: tensor_pb2.TensorChunk,
    content: memoryview,
    assemblers: dict[str, Taken],
    max_chunk_bytes: int,
) -> None:
    """A fused chunk's gradients, checked whole first (``fused.checked``) and for NaN and Inf together (the store
    names the variable when one is not finite)."""
    what = f"replica {header.replica_id}'s push for step {header.step}"
    check_chunk_size(content.nbytes, max_chunk_bytes, f"fused gradients in {what}")
    layouts = _LAYOUTS.setdefault(store, {})
    layout, flat = fused.checked(chunk, content, store.specs.get, what, assemblers.__contains__, layouts)
    members = fused.members(layout, flat)
    finite = header.checked or (store.training.nonfinite != "apply" and all_finite(flat))
    for name, grad in members:
        assemblers[name] = WholeGradient(name, grad, finite)
    assemblers[members[0][0]].fused_with = (tuple(name for name, _ in members), flat)


class WholeGradient:
    """A gradient that arrived whole, as a member of a fused chunk already checked against its spec
    (``fused.checked``): the array as it lies in the received bytes, and what the store reads of an assembler
    (``gradient``, ``finite``, ``fused_with``). A server takes one for each member of every push, so it keeps
    no byte ranges and makes no message until one is needed."""

    __slots__ = ("array", "finite", "fused_with", "name")

    def __init__(self, name: str, array: np.ndarray, finite: bool) -> None:
        self.name = name
        self.array: np.ndarray | None = array
        self.finite = finite
        # Set on the first member of a fused chunk: the members' names and the chunk's content as one flat array.
        self.fused_with: tuple[tuple[str, ...], np.ndarray] | None = None

    def gradient(self) -> np.ndarray:
        assert self.array is not None, "a released gradient"
        return self.array

    def release(self) -> None:
        self.array, self.fused_with = None, None


# What a push's intake holds for each gradient: its assembler, or the gradient itself when it came fused.
Taken = TensorAssembler | WholeGradient
