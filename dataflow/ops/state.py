"""State and plumbing ops: constants, placeholders, variables, assignment, grouping."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..dtypes import DTYPES, STRING, as_dtype, as_strings, kind, outside_int_range, past_float_range
from ..errors import DTypeError, GraphError, ShapeError
from ..graph import Graph, Node, Tensor, get_default_graph
from ..kernels.cuda import cuda_kernel
from ..opdef import InferContext, KernelContext, OpDef, TensorSpec, not_differentiable, register_op, simple_kernel
from ..shapes import fmt
from .base import TensorLike, apply, apply_node, as_tensor, infer_same, rule_checked

FAMILY = "state"


# ------------------------------------------------------------------- Const
def _const_kernel(node: Node, ctx: KernelContext) -> Callable[[], np.ndarray]:
    value = node.attrs["value"]
    return lambda: value


register_op(
    OpDef(
        name="Const",
        strings=True,
        family=FAMILY,
        infer=lambda ctx: TensorSpec(ctx.attrs["value"].shape, as_dtype(ctx.attrs["value"].dtype)),
        reference=lambda attrs: attrs["value"],
        grad=lambda node, dys: [],
        kernels={"cpu": _const_kernel, "cuda": cuda_kernel("state", "const_op")},
        view=True,
    )
)


def constant(value: Any, dtype: str | None = None, name: str = "const", graph: Graph | None = None) -> Tensor:
    """A tensor holding a fixed value; with ``dtype``, its numbers must keep their values in it."""
    text = as_dtype(dtype) == STRING if dtype else np.asarray(value).dtype.kind in "OU"
    if text:
        array = as_strings(value, f"constant {name!r}").copy()
    else:
        if dtype:
            _check_fits(np.asarray(value), as_dtype(dtype), name)
        array = np.array(value, dtype=DTYPES[as_dtype(dtype)] if dtype else None)
    if dtype is None and array.dtype.name in _NARROWED:
        array = _narrowed(array, name)
    as_dtype(array.dtype)
    if not array.dtype.isnative:  # a big-endian array (from a file written elsewhere): the kernels read native
        array = array.astype(array.dtype.newbyteorder("="))
    array.flags.writeable = False
    g = graph or get_default_graph()
    return g.create_node("Const", [], {"value": array}, name).output(0)


# Without a dtype, float64 and int64 numbers (NumPy's and Python's defaults) are held as float32 and int32.
_NARROWED = {"float64": "float32", "int64": "int32"}


def _narrowed(array: np.ndarray, name: str) -> np.ndarray:
    """``array`` in its default dtype, refused where a number would not survive: 2**40 became 0 and 1e300 inf
    without a word (NumPy's cast wraps integers round and only warns of the overflow)."""
    target = _NARROWED[array.dtype.name]
    outside = outside_int_range(array, target) or past_float_range(array, target)
    if outside is not None:
        raise DTypeError(
            f"constant {name!r}: {outside}, and without a dtype its {array.dtype.name} numbers are made {target}: "
            f"pass dtype={array.dtype.name!r} to keep them"
        )
    return array.astype(target)


def _check_fits(source: np.ndarray, dtype: str, name: str) -> None:
    """Raise unless every number of ``source`` is the same number in ``dtype``: an integer that wraps round,
    a fraction cut off, or a float past the dtype's range (inf) would change the constant without a word."""
    if source.dtype.kind not in "iuf":
        return
    outside = outside_int_range(source, dtype) or past_float_range(source, dtype)
    if outside is not None:
        raise DTypeError(f"constant {name!r} as {dtype}: {outside}")
    if source.dtype.kind == "f" and kind(dtype) in "iu" and not np.array_equal(source, np.trunc(source)):
        raise DTypeError(f"constant {name!r} as {dtype}: it holds values that are not whole numbers")


# ------------------------------------------------------------- Placeholder
def _placeholder_kernel(node: Node, ctx: KernelContext) -> Callable[[], np.ndarray]:
    raise GraphError(f"placeholder {node.name!r} ({node.where()}) needs a value: pass it in feed_dict")


register_op(
    OpDef(
        name="Placeholder",
        strings=True,
        family=FAMILY,
        infer=lambda ctx: TensorSpec(tuple(ctx.attrs["shape"]), ctx.attrs["dtype"]),
        reference=lambda attrs: None,
        grad=lambda node, dys: [],
        kernels={"cpu": _placeholder_kernel, "cuda": _placeholder_kernel},
    )
)


def placeholder(shape: Sequence[int | None], dtype: str = "float32", name: str = "placeholder") -> Tensor:
    """An input that is fed at run time; ``None`` dims accept any size."""
    dims = tuple(None if d is None or d == -1 else int(d) for d in shape)
    if any(d is not None and d < 0 for d in dims):
        raise ShapeError(f"placeholder {name!r}: negative dimension in shape {fmt(dims)}")
    return get_default_graph().create_node("Placeholder", [], {"shape": dims, "dtype": as_dtype(dtype)}, name).output(0)


# ---------------------------------------------------------------- Variable
def _variable_kernel(node: Node, ctx: KernelContext) -> Callable[[], np.ndarray]:
    value = ctx.variables.value(node)
    return lambda: value


register_op(
    OpDef(
        name="Variable",
        family=FAMILY,
        infer=lambda ctx: TensorSpec(ctx.attrs["initial_value"].shape, ctx.attrs["initial_value"].dtype.name),
        reference=lambda attrs: attrs["initial_value"],
        grad=lambda node, dys: [],
        kernels={"cpu": _variable_kernel, "cuda": cuda_kernel("state", "variable_op")},
        stateful=True,
        view=True,
    )
)


def variable(
    init: Any,
    shape: Sequence[int] | None = None,
    dtype: str = "float32",
    name: str = "variable",
    trainable: bool = True,
    seed: int | None = None,
) -> Tensor:
    """A trainable tensor whose value lives in the session.

    ``init`` is an array-like, or an initializer from ``cg.init`` called with
    ``shape`` and ``dtype``.

    Examples
    --------
    >>> import cellgraph as cg
    >>> w = cg.variable(cg.init.zeros, shape=(3, 2), name="w")
    >>> w.shape
    (3, 2)
    """
    g = get_default_graph()
    if callable(init):
        if shape is None:
            raise ShapeError(f"variable {name!r}: an initializer needs a shape")
        # Without a seed, the variable's full name seeds it: the same model
        # starts from the same values every run, and a re-run cell too.
        if seed is None:
            seed = zlib.crc32(g.unique_name(name).encode())
        value = np.asarray(init(tuple(shape), as_dtype(dtype), seed))
    else:
        source = np.asarray(init)
        if source.dtype.kind in "OUS" or as_dtype(dtype) == STRING:
            # A variable is trained, checkpointed and served by parameter servers: all numbers.
            raise DTypeError(
                f"variable {name!r}: a variable holds numbers, not text ({source.dtype} as {as_dtype(dtype)}); "
                "use cg.constant or a placeholder for strings"
            )
        # A number past the dtype's range would be wrapped round (an int) or made inf (a float) without a word.
        outside = outside_int_range(source, as_dtype(dtype)) or past_float_range(source, as_dtype(dtype))
        if outside is not None:
            raise DTypeError(f"variable {name!r} as {as_dtype(dtype)}: {outside}")
        value = np.array(source, dtype=as_dtype(dtype))
        if shape is not None and tuple(shape) != value.shape:
            raise ShapeError(
                f"variable {name!r}: initial value has shape {fmt(value.shape)}, expected {fmt(tuple(shape))}"
            )
    value.flags.writeable = False
    return g.create_node("Variable", [], {"initial_value": value, "trainable": trainable}, name).output(0)


# ----------------------------------------------------------------- Identity
# Device-agnostic: it hands on whatever array (host or device) it is given.
_identity = simple_kernel(lambda x: x)
register_op(
    OpDef(
        name="Identity",
        strings=True,
        family=FAMILY,
        infer=infer_same,
        reference=lambda attrs, x: x,
        grad=lambda node, dys: [dys[0]],
        kernels={"cpu": _identity, "cuda": _identity},
        view=True,
    )
)


def identity(x: TensorLike, name: str = "identity") -> Tensor:
    return apply("Identity", [x], name=name)


# ------------------------------------------------------- Assign, AssignAdd
def _infer_assign(ctx: InferContext) -> TensorSpec:
    ref, value = ctx.inputs
    target = ctx.node.inputs[0].node
    if target.op != "Variable":
        raise ctx.graph_error(f"can only assign to a variable, not to {target.op} '{target.name}'")
    if ref.dtype != value.dtype:
        raise ctx.dtype_error(f"value has dtype {value.dtype}, variable '{target.name}' has {ref.dtype}")
    if len(ref.shape) != len(value.shape) or any(v is not None and v != r for r, v in zip(ref.shape, value.shape)):
        raise ctx.shape_error(f"value has shape {fmt(value.shape)}, variable '{target.name}' has {fmt(ref.shape)}")
    return ref


def _assign(ref: np.ndarray, value: np.ndarray) -> np.ndarray:
    ref[...] = value
    return ref


def _assign_add(ref: np.ndarray, value: np.ndarray) -> np.ndarray:
    ref += value
    return ref


register_op(
    OpDef(
        name="Assign",
        family=FAMILY,
        infer=_infer_assign,
        reference=lambda attrs, ref, value: value.copy(),
        grad=not_differentiable,
        # The rule runs again over the arrays: a (1,) value fed for a (3,) variable filled all three without a word.
        kernels={
            "cpu": rule_checked(lambda node, ctx: _assign),
            "cuda": rule_checked(cuda_kernel("state", "assign_op")),
        },
        stateful=True,
        view=True,
    )
)
register_op(
    OpDef(
        name="AssignAdd",
        family=FAMILY,
        infer=_infer_assign,
        reference=lambda attrs, ref, value: ref + value,
        grad=not_differentiable,
        kernels={
            "cpu": rule_checked(lambda node, ctx: _assign_add),
            "cuda": rule_checked(cuda_kernel("elementwise", "assign_add_op")),
        },
        stateful=True,
        view=True,
    )
)


def _assigned_value(ref: Tensor, value: TensorLike) -> Tensor:
    # A tensor goes to the shape rule as it is, so a wrong dtype is reported
    # there, naming the node and the variable; a Python value takes the
    # variable's dtype.
    return value if isinstance(value, Tensor) else as_tensor(value, ref.dtype, ref.graph)


def assign(ref: Tensor, value: TensorLike, name: str = "assign") -> Tensor:
    """Write ``value`` into variable ``ref`` when run; returns the new value."""
    return apply("Assign", [ref, _assigned_value(ref, value)], name=name)


def assign_add(ref: Tensor, value: TensorLike, name: str = "assign_add") -> Tensor:
    """Add ``value`` to variable ``ref`` in place when run."""
    return apply("AssignAdd", [ref, _assigned_value(ref, value)], name=name)


# ---------------------------------------------------------------- NoOp
_no_op = simple_kernel(lambda: ())
register_op(
    OpDef(
        name="NoOp",
        family=FAMILY,
        infer=lambda ctx: [],
        reference=lambda attrs: (),
        grad=not_differentiable,
        kernels={"cpu": _no_op, "cuda": _no_op},
    )
)


def group(*deps: Tensor | Node, name: str = "group") -> Node:
    """One node that, when run, runs everything in ``deps`` first."""
    g = get_default_graph()
    for d in deps:
        if isinstance(d, (Tensor, Node)):
            g = d.graph if isinstance(d, Tensor) else d.graph or g
            break
    with g.control_dependencies(list(deps)):
        return g.create_node("NoOp", [], {}, name)


def no_op(name: str = "no_op") -> Node:
    return apply_node("NoOp", [], name=name)


__all__ = ["assign", "assign_add", "constant", "group", "identity", "no_op", "placeholder", "variable"]
