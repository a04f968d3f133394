"""Dtype policies of the layers: ``with cg.layers.policy("mixed_float16"):`` builds a Keras-style mixed model.

A policy says in which dtype a layer keeps its variables and in which it
computes (Keras's ``variable_dtype`` and ``compute_dtype``):

=================  ==============  =============
policy             variables       compute
=================  ==============  =============
``float32``        float32         float32 (the default)
``mixed_float16``  float32         float16
``mixed_bfloat16`` float32         bfloat16
=================  ==============  =============

Under a mixed policy a layer makes float32 variables (the master weights an
optimizer updates), casts each where it reads it to the compute dtype, casts
its float input to the compute dtype, and returns the compute dtype. What
Keras and ``torch.autocast`` compute in float32 stays float32: batch and
layer normalization (statistics and moving statistics), attention's softmax.
The losses (``cg.losses``) widen half logits to float32, so the loss is
float32. Train a ``mixed_float16`` model with ``cg.optim.mixed_precision``
(its loss scale keeps small float16 gradients from underflowing); a
``mixed_bfloat16`` one trains with a plain optimizer too (bfloat16 has
float32's range).

Under the ``float32`` policy a half input (float16 or bfloat16) is cast to
float32 and the layer computes and returns float32, as a Keras layer's dtype
decides its computation; a float32 or float64 input keeps its dtype (and the
variables take it), as cellgraph's layers always did.

Why a scope, not a graph-wide or global setting: a ``with`` block in the cell
that builds the model says what it builds, so re-running the cell rebuilds the
same graph whatever other cells set, and a scope nests, which is how a mixed
model keeps its last layer in float32 (Keras's advice for the logits):
``with cg.layers.policy("float32"): logits = cg.layers.dense(h, 10)``. The
policy is read when a layer is built; the graph records the casts, so a
session, a saved model or an exported ONNX file needs no policy.

Examples
--------
>>> import cellgraph as cg
>>> g = cg.Graph()
>>> with g.as_default(), cg.layers.policy("mixed_float16"):
...     x = cg.placeholder((None, 4), name="x")
...     h = cg.layers.dense(x, 8, activation="relu", name="hidden")
...     with cg.layers.policy("float32"):
...         logits = cg.layers.dense(h, 3, name="logits")
>>> g.node("hidden/kernel").output(0).dtype, h.dtype, logits.dtype
('float32', 'float16', 'float32')
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from cellgraph.dataflow.dtypes import is_float, is_half
from cellgraph.dataflow.errors import DTypeError
from cellgraph.dataflow.graph import Tensor
from cellgraph.dataflow.ops.math import cast


@dataclass(frozen=True)
class Policy:
    """A layer dtype policy: ``name``, the dtype of its variables and the dtype it computes in."""

    name: str
    variable_dtype: str
    compute_dtype: str

    @property
    def mixed(self) -> bool:
        """Whether the layers compute in a narrower dtype than they keep their variables in."""
        return self.compute_dtype != self.variable_dtype

    def __repr__(self) -> str:
        return f"<Policy {self.name!r}: variables {self.variable_dtype}, compute {self.compute_dtype}>"


POLICIES: dict[str, Policy] = {
    "float32": Policy("float32", "float32", "float32"),
    "mixed_float16": Policy("mixed_float16", "float32", "float16"),
    "mixed_bfloat16": Policy("mixed_bfloat16", "float32", "bfloat16"),
}
# A context variable, not a module global: a scope entered in one thread (a Dask worker's, say) is not seen in another.
_current: ContextVar[Policy] = ContextVar("cellgraph_layer_policy", default=POLICIES["float32"])


def as_policy(value: str | Policy) -> Policy:
    """The policy named ``value`` (or ``value`` itself), or a ValueError listing the known names."""
    if isinstance(value, Policy):
        return value
    if not isinstance(value, str) or value not in POLICIES:
        raise ValueError(
            f"unknown dtype policy {value!r}; known: {', '.join(sorted(POLICIES))} "
            "(variables float32, compute float16 or bfloat16 for the mixed ones)"
        )
    return POLICIES[value]


@contextmanager
def policy(value: str | Policy) -> Iterator[Policy]:
    """Build the layers inside with dtype policy ``value`` (``"float32"``, ``"mixed_float16"``, ``"mixed_bfloat16"``).

    Examples
    --------
    >>> import cellgraph as cg
    >>> with cg.layers.policy("mixed_bfloat16") as p:
    ...     cg.layers.current_policy()
    <Policy 'mixed_bfloat16': variables float32, compute bfloat16>
    >>> cg.layers.current_policy().name
    'float32'
    """
    token = _current.set(as_policy(value))
    try:
        yield _current.get()
    finally:
        _current.reset(token)


def current_policy() -> Policy:
    """The policy the layers built here would follow (``float32`` outside every ``policy`` scope)."""
    return _current.get()


def layer_input(x: object, layer: str, name: str, what: str = "input") -> Tensor:
    """``x``, a layer's input, which must be a Tensor: a NumPy array given to a layer (as Keras takes one)
    ended in "AttributeError: 'numpy.ndarray' object has no attribute 'graph'"; now the error says how data
    reaches a graph."""
    if isinstance(x, Tensor):
        return x
    shape = getattr(x, "shape", None)
    kind = type(x).__qualname__ if type(x).__module__ == "builtins" else f"{type(x).__module__}.{type(x).__qualname__}"
    shown = kind + (f" of shape {tuple(shape)}" if shape is not None else "")
    raise TypeError(
        f"{layer} layer {name!r}: its {what} must be a cellgraph Tensor (a cg.placeholder or an op's output), "
        f"got a {shown}; feed data through a placeholder (session.run(..., {{x: data}})), or make it part of "
        "the graph with cg.constant(data)"
    )


def layer_dtypes(x: Tensor, layer: str, name: str) -> tuple[str, str]:
    """``(variable dtype, compute dtype)`` of layer ``name`` (a ``layer`` layer) given input ``x``.

    A mixed policy's dtypes for a float input; a non-float input under it is
    refused. Otherwise float32 for a half input, and the input's own dtype
    for any other (float32 and float64 layers are built as they always were).
    """
    current = current_policy()
    if current.mixed:
        if not is_float(x.dtype):
            raise DTypeError(
                f"{layer} layer {name!r} under dtype policy {current.name!r} needs a float input, got {x.dtype} "
                f"({x.name!r}); cast it (cg.cast(x, {current.compute_dtype!r}))"
            )
        return current.variable_dtype, current.compute_dtype
    if is_half(x.dtype):
        return "float32", "float32"
    return x.dtype, x.dtype


def to_compute(x: Tensor, dtype: str, name: str) -> Tensor:
    """``x`` in compute dtype ``dtype``: cast when it is a float of another dtype (a Cast node named ``name``)."""
    return cast(x, dtype, name=name) if is_float(x.dtype) and x.dtype != dtype else x


def read(var: Tensor, dtype: str) -> Tensor:
    """Variable ``var`` as the layer reads it: cast to compute dtype ``dtype`` where they differ
    (``dense/kernel`` is read through ``dense/kernel_float16``); its gradient arrives in float32."""
    short = var.node.name.rsplit("/", 1)[-1]
    return to_compute(var, dtype, name=f"{short}_{dtype}")


__all__ = ["POLICIES", "Policy", "as_policy", "current_policy", "layer_dtypes", "policy", "read", "to_compute"]
