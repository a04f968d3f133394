"""Building nodes: turn Python values into tensors and apply registered ops."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ParamSpec, TypeVar

import numpy as np

from ..dtypes import DTYPES, STRING, as_dtype, as_strings, is_float, is_half, kind, outside_int_range, past_float_range
from ..errors import DTypeError, ShapeError
from ..graph import Graph, Node, Tensor, get_default_graph
from ..opdef import InferContext, Shape, TensorSpec
from ..shapes import broadcast, fmt

TensorLike = Tensor | float | int | bool | np.ndarray | Sequence[Any]


def graph_of(values: Sequence[Any]) -> Graph:
    """The graph the tensors among ``values`` live in, else the default graph. Tensors of several graphs are
    refused when the op is made; the default graph is the one being built if any of them lives there, so that
    the refusal names the tensor from elsewhere."""
    graphs = [v.graph for v in values if isinstance(v, Tensor)]
    if not graphs:
        return get_default_graph()
    default = get_default_graph()
    if any(g is not graphs[0] for g in graphs) and any(g is default for g in graphs):
        return default
    return graphs[0]


def as_tensor(value: TensorLike, dtype: str | None = None, graph: Graph | None = None, op: str | None = None) -> Tensor:
    """``value`` itself if it is a Tensor, else a new Const node holding it.

    With ``dtype``, a Python value is converted by :func:`operand_array`'s rule;
    ``op`` names the op it is an operand of, for the error message.
    """
    if isinstance(value, Tensor):
        if dtype is not None and value.dtype != dtype:
            raise DTypeError(f"tensor {value.name!r} has dtype {value.dtype}, expected {dtype}")
        return value
    if dtype is None:
        array = np.asarray(value)
        # Python floats become float32 (the working precision), not float64.
        if array.dtype.kind in "OU":
            dtype = STRING
        else:
            dtype = "float32" if array.dtype.kind == "f" else as_dtype(array.dtype.name.replace("int64", "int32"))
    else:
        array = operand_array(value, dtype, op)
    from .state import constant

    return constant(array, dtype=dtype, graph=graph)


def operand_array(value: Any, dtype: str, op: str | None = None) -> np.ndarray:
    """``value`` (a Python scalar, list or NumPy array) as an array of ``dtype``.

    The value takes the tensor's dtype when that keeps its kind, as NumPy's
    ``same_kind`` casting does (float to float, int to int or float, bool to
    anything); an integer must also fit. A float scalar may go into an int
    tensor only when it is a whole number (``i + 2.0``); a float array or list
    into an int tensor, or anything but bool into a bool tensor, is refused:
    that would change what the numbers are without a word.
    """
    where = f"{op}: " if op else ""
    if as_dtype(dtype) == STRING:  # equal(names, "cat"): the str is a string operand
        return as_strings(value, f"{where}operand {_short(value)}")
    array = np.asarray(value)
    target = DTYPES[as_dtype(dtype)]
    what = _short(value) if array.ndim == 0 else f"{_a(array.dtype.name)} array"
    # bfloat16 is an extension type (NumPy kind 'V'): ask cellgraph's kind of it.
    source = kind(array.dtype.name) if array.dtype.name in DTYPES else array.dtype.kind
    if source not in "biuf":
        raise DTypeError(f"{where}cannot use {what} ({array.dtype}) as {_a(dtype)} value")
    if array.ndim == 0 and source == "f" and target.kind in "iub":
        if not np.array_equal(array, np.round(array)):
            # x + 1.5 with an int32 x must not quietly become x + 1.
            raise DTypeError(f"{where}cannot use {value!r} as {_a(dtype)} value: it is not a whole number")
    # int -> int of either signedness is fine when every value fits (checked below): x + 1 with a uint8 x.
    elif not (source in "iu" and target.kind in "iu") and not np.can_cast(array.dtype, target, "same_kind"):
        raise DTypeError(
            f"{where}cannot use {_a(array.dtype.name)} {'value' if array.ndim == 0 else 'array'} as {_a(dtype)} "
            f"operand: that changes its kind; convert it first (e.g. np.asarray(value, {dtype!r}))"
        )
    outside = outside_int_range(array, as_dtype(dtype))
    if outside is not None:
        raise DTypeError(f"{where}cannot use {what} as {_a(dtype)} value: {outside}")
    outside = past_float_range(array, as_dtype(dtype))
    if outside is not None:  # h * 70000.0 with a float16 h would multiply by inf
        wider = "float32" if is_half(as_dtype(dtype)) else "float64"
        raise DTypeError(
            f"{where}cannot use {what} as {_a(dtype)} value: {outside}; compute in {wider} (cg.cast(x, {wider!r}))"
        )
    return array.astype(target, copy=False)


def _a(noun: str) -> str:
    """``noun`` with its indefinite article: "an int32", "a float32"."""
    return f"{'an' if noun[0] in 'aeio' else 'a'} {noun}"  # "a uint8": the u sounds like "you"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def apply(
    op: str,
    inputs: Sequence[TensorLike],
    attrs: dict[str, Any] | None = None,
    name: str | None = None,
) -> Tensor:
    """Add one node of type ``op`` and return its first output."""
    return apply_node(op, inputs, attrs, name).output(0)


def apply_node(
    op: str,
    inputs: Sequence[TensorLike],
    attrs: dict[str, Any] | None = None,
    name: str | None = None,
) -> Node:
    g = graph_of(inputs)
    with g.atomic():  # constants made for Python values go again if the op is rejected
        tensors = [as_tensor(v, graph=g) for v in inputs]
        return g.create_node(op, tensors, attrs, name)


def binary_inputs(a: TensorLike, b: TensorLike, op: str | None = None) -> tuple[Tensor, Tensor]:
    """Two operands of one dtype: a Python value (scalar, list or NumPy array)
    takes the other side's dtype by :func:`operand_array`'s rule."""
    g = graph_of([a, b])
    if isinstance(a, Tensor) and not isinstance(b, Tensor):
        return a, as_tensor(b, a.dtype, g, op)
    if isinstance(b, Tensor) and not isinstance(a, Tensor):
        return as_tensor(a, b.dtype, g, op), b
    return as_tensor(a, graph=g), as_tensor(b, graph=g)


# ------------------------------------------------------------ shape rules
def infer_same(ctx: InferContext) -> TensorSpec:
    """Output like the first input (unary elementwise ops)."""
    return ctx.inputs[0]


def infer_float_unary(ctx: InferContext) -> TensorSpec:
    x = ctx.inputs[0]
    if not is_float(x.dtype):
        raise ctx.dtype_error(f"expects a float tensor, got {x.dtype}")
    return x


def infer_broadcast(ctx: InferContext, out_dtype: str | None = None) -> TensorSpec:
    """Binary elementwise op: same dtypes, NumPy-broadcast shapes."""
    a, b = ctx.inputs
    if a.dtype != b.dtype:
        raise ctx.dtype_error(f"operands have different dtypes: {a.dtype} and {b.dtype}")
    shape = broadcast(a.shape, b.shape)
    if shape is None:
        raise ctx.shape_error(f"shapes do not broadcast: {fmt(a.shape)} and {fmt(b.shape)}")
    return TensorSpec(shape, out_dtype or a.dtype)


def infer_float_broadcast(ctx: InferContext) -> TensorSpec:
    spec = infer_broadcast(ctx)
    if not is_float(spec.dtype):
        raise ctx.dtype_error(f"expects float tensors, got {spec.dtype}")
    return spec


def infer_compare(ctx: InferContext) -> TensorSpec:
    return infer_broadcast(ctx, out_dtype="bool")


def require_float(ctx: InferContext, *specs: TensorSpec) -> str:
    """The one float dtype of ``specs``, or a DTypeError naming them."""
    dtypes = [s.dtype for s in specs]
    if any(d != dtypes[0] for d in dtypes):
        raise ctx.dtype_error(f"operands have different dtypes: {', '.join(dtypes)}")
    if not is_float(dtypes[0]):
        raise ctx.dtype_error(f"expects float tensors, got {dtypes[0]}")
    return dtypes[0]


def upstream(dys: list[Tensor | None], i: int = 0) -> Tensor:
    """Upstream gradient ``i`` of a gradient rule's ``dys``: a rule for a single-output op always gets one."""
    dy = dys[i]
    assert dy is not None
    return dy


def fits(shape: Shape, expected: Shape) -> bool:
    return len(shape) == len(expected) and all(a is None or b is None or a == b for a, b in zip(shape, expected))


def check_fits(ctx: InferContext, what: str, spec: TensorSpec, expected: Shape) -> None:
    if not fits(spec.shape, expected):
        raise ctx.shape_error(f"{what} has shape {fmt(spec.shape)}, expected {fmt(expected)}")


def shapes_checked(factory: Any, problem: Callable[..., str | None]) -> Any:
    """``factory``'s kernel, first asking ``problem(node, *inputs)`` about the inputs' run-time shapes.

    A shape rule lets unknown dims through; a kernel that reads one input by another's shape (a gamma per
    normalized element, a gradient per variable element) then reads past the end of a shorter one, and
    returns what memory held there without a word. ``problem`` gives the words of a mismatch (the run fails
    with them, naming the node) or None.
    """

    def bind(node: Node, ctx: Any) -> Any:
        run = factory(node, ctx)
        # The shapes that passed last: a training loop gives the same shapes step after step, and comparing them
        # (about 0.3 us) is what the check then costs, not the rule's (several us per op and step).
        passed: list[tuple[Any, ...] | None] = [None]

        def checked(*arrays: Any) -> Any:
            shapes = tuple([a.shape for a in arrays])  # a list, not a generator: 0.3 us less a call
            if shapes != passed[0]:
                words = problem(node, *arrays)
                if words is not None:
                    raise ValueError(words)
                passed[0] = shapes
            return run(*arrays)

        return checked

    return bind


class _ArraysContext(InferContext):
    """A shape rule's view of the arrays a kernel is given: its errors carry their words alone (the failed run
    names the node)."""

    def shape_error(self, message: str) -> ShapeError:
        return ShapeError(message)


def _rule_problem(node: Node, *arrays: Any) -> str | None:
    ctx = _ArraysContext(node, [TensorSpec(tuple(a.shape), t.dtype) for a, t in zip(arrays, node.inputs)])
    try:
        node.opdef.infer(ctx)
    except ShapeError as err:
        return str(err)
    return None


def rule_checked(factory: Any) -> Any:
    """``factory``'s kernel, running the op's own shape rule again over its arrays' shapes first: what the rule
    let through as unknown dims is checked when the sizes are known (see :func:`shapes_checked`)."""
    return shapes_checked(factory, _rule_problem)


def merge_shapes(a: Shape, b: Shape) -> Shape:
    """Two fitting shapes as one, each unknown dim taken from the other side."""
    return tuple(x if x is not None else y for x, y in zip(a, b))


def elementwise_kernel(fn: Any) -> Any:
    """Bind an elementwise kernel, run on its operands' fewest dimensions (``on_fewest_dims``); Numba returns
    a scalar for 0-d operands, so rank-0 nodes (known when binding) wrap the result back into an array."""

    def factory(node: Node, ctx: Any) -> Any:
        if node.specs[0].shape:
            return on_fewest_dims(fn, len(node.inputs))
        dtype = np.dtype(node.specs[0].dtype)
        return lambda *args: np.asarray(fn(*args), dtype)

    return factory


def on_fewest_dims(fn: Any, arity: int) -> Callable[..., Any]:
    """``fn``, an elementwise kernel of ``arity`` operands, called on views of its C-contiguous operands with
    each run of dimensions that broadcast alike merged into one: same-shaped operands become 1-D, a
    (N, H, W, C) tensor and its (C,) bias become (N*H*W, C) and (1, C).

    The numbers are the same, element by element; what changes is what Numba
    compiles, one loop per rank and dtype: a 4-D array expression takes about
    7 s to compile, a 1-D one 0.3 s, and a model's elementwise ops then share
    a few low ranks (ONNX's conformance cases: 146 s to 52 s from an empty
    cache). Operands that are not C-contiguous arrays, or whose shapes do not
    broadcast, go to ``fn`` as they are (which says what is wrong). The cost
    is about a microsecond a call.
    """
    if arity == 1:

        def unary(x: Any) -> Any:
            if type(x) is not np.ndarray or x.ndim < 2 or not x.flags.c_contiguous:
                return fn(x)
            return fn(x.ravel()).reshape(x.shape)

        return unary
    plans: dict[tuple[tuple[int, ...], ...], _Merge] = {}

    def plan_of(shapes: tuple[tuple[int, ...], ...]) -> _Merge:
        plan = plans.get(shapes)
        if plan is None:
            plan = _fewest_dims(shapes) or _AS_THEY_ARE
            if len(plans) < _MAX_PLANS:  # a node sees a few shapes (one per batch size); never grow unbounded
                plans[shapes] = plan
        return plan

    if arity == 2:

        def binary(a: Any, b: Any) -> Any:
            if type(a) is not np.ndarray or type(b) is not np.ndarray:
                return fn(a, b)
            plan = plan_of((a.shape, b.shape))
            if plan is _AS_THEY_ARE or not (a.flags.c_contiguous and b.flags.c_contiguous):
                return fn(a, b)
            (shape_a, shape_b), out = plan
            return fn(a.reshape(shape_a), b.reshape(shape_b)).reshape(out)

        return binary

    def nary(*args: Any) -> Any:
        if not all(type(a) is np.ndarray and a.flags.c_contiguous for a in args):
            return fn(*args)
        plan = plan_of(tuple(a.shape for a in args))
        if plan is _AS_THEY_ARE:
            return fn(*args)
        merged, out = plan
        return fn(*[a.reshape(m) for a, m in zip(args, merged, strict=True)]).reshape(out)

    return nary


# Each operand's merged shape, and the result's shape.
_Merge = tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]
_AS_THEY_ARE: _Merge = ((), ())  # nothing to merge: the operands go to the kernel unchanged
_MAX_PLANS = 64


def _fewest_dims(shapes: tuple[tuple[int, ...], ...]) -> _Merge | None:
    """Each operand's merged shape and the result's shape, or None when the shapes do not broadcast or merging
    saves nothing."""
    try:
        out = tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        return None
    rank = len(out)
    padded = [(1,) * (rank - len(shape)) + shape for shape in shapes]
    runs: list[tuple[tuple[bool, ...], int]] = []  # (which operands span this run, its size)
    for axis, size in enumerate(out):
        if size == 1:
            continue  # every operand is 1 here
        spans = tuple(shape[axis] == size for shape in padded)
        if runs and runs[-1][0] == spans:
            runs[-1] = (spans, runs[-1][1] * size)
        else:
            runs.append((spans, size))
    if len(runs) == rank and all(len(shape) == rank for shape in shapes):
        return None  # nothing to merge: call fn as it is
    if not runs:
        runs = [((True,) * len(shapes), 1)]
    merged = tuple(tuple(size if spans[k] else 1 for spans, size in runs) for k in range(len(shapes)))
    return merged, out


P = ParamSpec("P")
R = TypeVar("R")


def _graph_among(values: Iterable[Any]) -> Graph:
    for v in values:
        if isinstance(v, Tensor):
            return v.graph
        if isinstance(v, (list, tuple)):
            for item in v:
                if isinstance(item, Tensor):
                    return item.graph
    return get_default_graph()


def atomic_op(fn: Callable[P, R]) -> Callable[P, R]:
    """Make a public op function all-or-nothing: when it raises, the constants
    and helper nodes it made on the way are removed again."""

    @functools.wraps(fn)
    def build(*args: P.args, **kwargs: P.kwargs) -> R:
        with _graph_among([*args, *kwargs.values()]).atomic():
            return fn(*args, **kwargs)

    return build
