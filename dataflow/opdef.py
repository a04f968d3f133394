"""What one op is: its shape rule, reference, gradient and kernels, in one entry.

Every pass (shape inference, autodiff, the executor, later placement and
fusion) reads an op's behaviour from its ``OpDef``; none branches on op names.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import DTypeError, GraphError, ShapeError
from .registry import Registry

if TYPE_CHECKING:
    from .graph import Node, Tensor

Shape = tuple[int | None, ...]


@dataclass(frozen=True)
class TensorSpec:
    """The static type of a tensor: shape (``None`` for an unknown dim) and dtype."""

    shape: Shape
    dtype: str

    @property
    def rank(self) -> int:
        return len(self.shape)


class InferContext:
    """What a shape rule sees: the node being built, its input specs and attrs."""

    def __init__(self, node: Node, inputs: Sequence[TensorSpec]) -> None:
        self.node = node
        self.inputs = list(inputs)
        self.attrs = node.attrs

    def shape_error(self, message: str) -> ShapeError:
        return ShapeError(f"{self.node.describe()}: {message}")

    def dtype_error(self, message: str) -> DTypeError:
        return DTypeError(f"{self.node.describe()}: {message}")

    def graph_error(self, message: str) -> GraphError:
        """Misuse that is about the graph, not shapes: e.g. assigning to a non-variable."""
        return GraphError(f"{self.node.describe()}: {message}")


class _NotDifferentiable:
    """The recorded decision that an op has no gradient (argmax, equal, ...)."""

    def __repr__(self) -> str:
        return "not_differentiable"


not_differentiable = _NotDifferentiable()

InferFn = Callable[[InferContext], "TensorSpec | list[TensorSpec]"]
# A gradient rule gets the forward node and one upstream gradient per output
# (None where nothing flows back) and returns one gradient per input.
GradFn = Callable[["Node", "list[Tensor | None]"], "Sequence[Tensor | None]"]
# A kernel factory binds a node (its attrs, its state) to a plain callable that
# takes the input arrays and returns the output array (a tuple for several).
KernelFactory = Callable[["Node", "KernelContext"], Callable[..., Any]]


class KernelContext:
    """What a bound kernel may reach besides its inputs: the session's variables,
    and the transport that Send and Recv move tensors between partitions with."""

    def __init__(self, variables: Any, transport: Any = None) -> None:
        self.variables = variables
        self.transport = transport

    def stream(self, node: Node, make: Callable[[int], Any]) -> Any:
        """Random node ``node``'s stream in this session, made by ``make(seed)`` the first time: every plan of the
        session draws the next values from it, and a new session starts the same sequence again. ``seed`` is the
        node's own, combined with the session's seed when it has one (``Session(graph, seed=...)``: the replicas
        of a job draw different dropout masks). A kernel bound without a session's variables has a stream of its
        own."""
        seed = session_seeded(int(node.attrs["seed"]), getattr(self.variables, "seed", None))
        stream = getattr(self.variables, "stream", None)
        if stream is None:
            return make(seed)
        return stream(f"{node.op}/{node.name}/{seed}", lambda: make(seed))


def session_seeded(op_seed: int, session_seed: int | None) -> int:
    """A random op's seed in a session seeded with ``session_seed``: the op's own when that is None, else a
    32-bit mix of both (NumPy's SeedSequence), so sessions of different seeds draw unrelated sequences.

    >>> session_seeded(7, None), session_seeded(7, 0) == session_seeded(7, 1)
    (7, False)
    """
    if session_seed is None:
        return op_seed
    return int(
        np.random.SeedSequence([op_seed & 0xFFFFFFFF, int(session_seed) & 0xFFFFFFFFFFFFFFFF]).generate_state(1)[0]
    )


@dataclass(frozen=True)
class OpDef:
    """One op: everything any pass needs to know about it."""

    name: str
    family: str
    infer: InferFn
    reference: Callable[..., Any]
    grad: GradFn | _NotDifferentiable
    kernels: dict[str, KernelFactory] = field(default_factory=dict)
    # Reads or writes variable state: never constant-folded or deduplicated.
    stateful: bool = False
    # The CPU kernel may return (a view of) its first input instead of a new
    # buffer, so the executor copies such outputs before handing them out.
    view: bool = False
    # Inputs broadcast NumPy-style; autodiff sums gradients back to each input.
    broadcasts: bool = False
    # Scalar expression over {0}, {1}, ... for elementwise fusion, if any.
    elementwise: str | None = None
    # Takes and makes string tensors (moves and comparisons): computed by ``reference`` on the CPU, since
    # Numba has no strings. Every other op refuses a string tensor when the node is built.
    strings: bool = False


OPS: Registry[OpDef] = Registry("op")


def register_op(opdef: OpDef) -> OpDef:
    # Every op takes the storage-only half floats through one kernel wrapper.
    from .kernels.storage import wrap

    wrap(opdef)
    return OPS.register(opdef.name, opdef, depth=2)


def simple_kernel(fn: Callable[..., Any]) -> KernelFactory:
    """A kernel factory for a kernel that needs neither attrs nor state."""
    return lambda node, ctx: fn
