"""Losses: cross-entropies (sigmoid, dense and sparse softmax), squared error, Huber and ``l2_loss``.

Each loss is written over existing ops in their numerically stable forms
(``softplus`` for the sigmoid cross-entropy, ``log_softmax`` for the dense
softmax one, the fused ``SparseSoftmaxCrossEntropyWithLogits`` op for class
indices), so its gradient, kernels and CUDA column come from those ops.

``reduction`` is PyTorch's: ``"mean"`` (the default) averages the per-element
(or per-example) losses, ``"sum"`` adds them and ``"none"`` returns them. The
sparse cross-entropy's mean is weighted, as ``torch.nn.functional.cross_entropy``
weights it: ``sum(weights * loss) / sum(weights)`` over the examples not
ignored. Every argument is checked before a node is made, and a bad one is a
``ShapeError``, ``DTypeError`` or ``ValueError`` naming the loss and the argument.

Half inputs (float16, bfloat16: the logits of a mixed-precision model) are
widened to float32 first, so the loss and its reductions are float32, as
under ``torch.autocast`` and Keras's mixed policies; labels and weights may
then be the half dtype or float32.
"""

from __future__ import annotations

from typing import Literal

from cellgraph.dataflow.dtypes import INTS, is_float, is_half
from cellgraph.dataflow.errors import DTypeError, ShapeError
from cellgraph.dataflow.graph import Tensor
from cellgraph.dataflow.ops import activations, array, logic, math, math_unary, nn, state
from cellgraph.dataflow.ops.base import TensorLike, as_tensor, fits, graph_of
from cellgraph.dataflow.shapes import fmt

Reduction = Literal["mean", "sum", "none"]
REDUCTIONS: tuple[Reduction, ...] = ("mean", "sum", "none")


# ------------------------------------------------------------------ checks
def _check_reduction(loss: str, reduction: str) -> None:
    if reduction not in REDUCTIONS:
        raise ValueError(f"{loss}: reduction must be one of {', '.join(map(repr, REDUCTIONS))}, got {reduction!r}")


def _float_input(loss: str, what: str, value: TensorLike, dtype: str | None = None, given: str | None = None) -> Tensor:
    """``value`` as a float tensor (of ``dtype`` when given), or a DTypeError naming ``what``.

    A half tensor is widened to float32 (the loss computes in float32); with ``dtype`` float32 and
    ``given`` (the logits' dtype before widening) half, ``value`` may be of either.
    """
    if isinstance(value, Tensor):
        if not is_float(value.dtype):
            raise DTypeError(f"{loss}: {what} must be a float tensor, got {value.dtype} ({value.name!r})")
        if dtype is not None and value.dtype not in (dtype, given):
            raise DTypeError(
                f"{loss}: {what} has dtype {value.dtype} but logits have {given or dtype}; they must match"
            )
    else:
        value = as_tensor(value, dtype=dtype)
    return math.cast(value, "float32", name=f"{what}_float32") if is_half(value.dtype) else value


def _dtype_of(value: TensorLike) -> str | None:
    """The dtype of a tensor as it was given (before a half one is widened); None for a Python or NumPy value."""
    return value.dtype if isinstance(value, Tensor) else None


def _same_shape(loss: str, what: str, a: Tensor, b: Tensor, other: str) -> Tensor:
    """``a``, which must have ``b``'s shape: a ShapeError when the graph is built, and a failed run when a fed
    shape differs (a same-shape ``ReshapeLike``: a transposed array of ``b``'s size fails too). Targets fed for 1 example against 3 predictions
    broadcast before, and the loss of every prediction against that one target was returned without a word
    (PyTorch's binary_cross_entropy_with_logits and cross_entropy refuse it)."""
    if not fits(a.shape, b.shape):
        raise ShapeError(f"{loss}: {what} has shape {fmt(a.shape)} but {other} has {fmt(b.shape)}; they must match")
    if a.shape == b.shape and None not in a.shape:
        return a
    return array.reshape_like(a, b, name=f"{what}_in_the_shape_of_{other}", same_shape=True)


def _reduce(per: Tensor, reduction: str, name: str) -> Tensor:
    if reduction == "mean":
        return math.reduce_mean(per, name=name)
    if reduction == "sum":
        return math.reduce_sum(per, name=name)
    return state.identity(per, name=name)


# ------------------------------------------------------------------ cross-entropies
def sigmoid_cross_entropy_with_logits(
    logits: TensorLike, labels: TensorLike, reduction: Reduction = "mean", name: str = "loss"
) -> Tensor:
    """Binary cross-entropy of ``logits`` against probabilities ``labels`` of the same shape.

    ``softplus(x) - x * z`` per element: ``max(x, 0) - x z + log(1 + exp(-|x|))``,
    which never overflows (TensorFlow's stable form; PyTorch's
    ``binary_cross_entropy_with_logits``). The gradient is ``sigmoid(x) - z``.

    Examples
    --------
    >>> import cellgraph as cg
    >>> g = cg.Graph()
    >>> with g.as_default():
    ...     loss = cg.losses.sigmoid_cross_entropy_with_logits(cg.constant([0.0, 1000.0]), cg.constant([1.0, 1.0]))
    >>> round(float(cg.Session(g).run(loss)), 4)  # (log 2 + 0) / 2
    0.3466
    """
    where = "sigmoid_cross_entropy_with_logits"
    _check_reduction(where, reduction)
    graph = graph_of([logits, labels])
    with graph.as_default(), graph.atomic():
        given = _dtype_of(logits)
        x = _float_input(where, "logits", logits)
        z = _float_input(where, "labels", labels, x.dtype, given)
        z = _same_shape(where, "labels", z, x, "logits")
        per = activations.softplus(x) - x * z
        return _reduce(per, reduction, name)


def softmax_cross_entropy_with_logits(
    logits: TensorLike, labels: TensorLike, axis: int = -1, reduction: Reduction = "mean", name: str = "loss"
) -> Tensor:
    """Cross-entropy of ``logits`` against a probability distribution ``labels`` along ``axis``.

    ``-sum(labels * log_softmax(logits), axis)`` per example (stable for any
    logits); the mean is over the examples. ``labels`` has the logits' shape
    and dtype, and gets a gradient too (``-log_softmax(logits)``), as in
    TensorFlow's ``softmax_cross_entropy_with_logits_v2``.

    Examples
    --------
    >>> import cellgraph as cg
    >>> g = cg.Graph()
    >>> with g.as_default():
    ...     loss = cg.losses.softmax_cross_entropy_with_logits(cg.constant([[0.0, 0.0]]), cg.constant([[0.5, 0.5]]))
    >>> round(float(cg.Session(g).run(loss)), 4)
    0.6931
    """
    where = "softmax_cross_entropy_with_logits"
    _check_reduction(where, reduction)
    graph = graph_of([logits, labels])
    with graph.as_default(), graph.atomic():
        given = _dtype_of(logits)
        x = _float_input(where, "logits", logits)
        z = _float_input(where, "labels", labels, x.dtype, given)
        rank = len(x.shape)
        if rank == 0 or not -rank <= axis < rank:
            raise ShapeError(f"{where}: axis {axis} is out of range for logits of shape {fmt(x.shape)}")
        if len(z.shape) == rank:
            n, m = z.shape[axis], x.shape[axis]
            if n is not None and m is not None and n != m:
                raise ShapeError(
                    f"{where}: labels have {n} classes but logits have {m}: {fmt(z.shape)} and {fmt(x.shape)}"
                )
        z = _same_shape(where, "labels", z, x, "logits")
        per = math.neg(math.reduce_sum(z * nn.log_softmax(x, axis), axis))
        return _reduce(per, reduction, name)


def sparse_softmax_cross_entropy(
    logits: TensorLike,
    labels: TensorLike,
    weights: TensorLike | None = None,
    ignore_index: int | None = None,
    reduction: Reduction = "mean",
    name: str = "loss",
) -> Tensor:
    """Cross-entropy of ``logits`` (..., C) against integer class ``labels`` (...), class axis last.

    ``weights`` (the labels' shape) scales each example's loss; an example whose
    label is ``ignore_index`` adds nothing and does not count. ``"mean"`` is
    ``sum(weights * loss) / sum(weights)`` over the examples kept (PyTorch's
    ``cross_entropy``; ``weights = class_weights[labels]`` gives its
    ``weight=``); with no example kept it is NaN, as in PyTorch. A label
    outside ``[0, C)`` that is not ``ignore_index`` fails the run, naming it.

    Examples
    --------
    >>> import cellgraph as cg
    >>> g = cg.Graph()
    >>> with g.as_default():
    ...     logits = cg.constant([[0.0, 0.0], [5.0, 0.0]])
    ...     loss = cg.losses.sparse_softmax_cross_entropy(logits, cg.constant([1, -100]), ignore_index=-100)
    >>> round(float(cg.Session(g).run(loss)), 4)  # the second example is ignored
    0.6931
    """
    where = "sparse_softmax_cross_entropy"
    _check_reduction(where, reduction)
    graph = graph_of([logits, labels] + ([] if weights is None else [weights]))
    with graph.as_default(), graph.atomic():
        given = _dtype_of(logits)
        x = _float_input(where, "logits", logits)
        y = as_tensor(labels)
        if y.dtype not in INTS:
            raise DTypeError(f"{where}: labels must be int32 or int64 class indices, got {y.dtype}")
        if len(x.shape) < 2:
            raise ShapeError(f"{where}: logits must have a batch axis and a class axis (last), got {fmt(x.shape)}")
        if not fits(y.shape, x.shape[:-1]):
            raise ShapeError(
                f"{where}: labels have shape {fmt(y.shape)} but logits {fmt(x.shape)} need labels of shape "
                f"{fmt(x.shape[:-1])} (one class index per row of logits)"
            )
        w = None if weights is None else _float_input(where, "weights", weights, x.dtype, given)
        if w is not None:
            w = _same_shape(where, "weights", w, y, "labels")
        if ignore_index is not None and (isinstance(ignore_index, bool) or not isinstance(ignore_index, int)):
            raise ValueError(f"{where}: ignore_index must be an int or None, got {ignore_index!r}")
        classes = x.shape[-1]
        if len(x.shape) > 2 and classes is None:
            raise ShapeError(f"{where}: logits of rank > 2 need a known class count (last axis), got {fmt(x.shape)}")
        if len(x.shape) == 2 and w is None and ignore_index is None and reduction == "mean":
            return math.reduce_mean(nn.sparse_softmax_cross_entropy(x, y), name=name)  # one fused op and a mean

        kept = None
        if ignore_index is not None:
            kept = logic.not_equal(y, ignore_index)
            y = math_unary.where(kept, y, 0)  # any valid class: the loss of an ignored example is multiplied by 0
        flat_x = x if len(x.shape) == 2 else array.reshape(x, (-1, classes))
        flat_y = y if len(y.shape) == 1 else array.reshape(y, (-1,))
        per = nn.sparse_softmax_cross_entropy(flat_x, flat_y)
        if len(y.shape) != 1:
            per = array.reshape_like(per, y)
        scale = w
        if kept is not None:
            # An ignored example adds exactly 0, as in PyTorch, even where its loss is inf (its stand-in class 0 may
            # have a logit of -inf): multiplied by a 0 mask it was NaN, and so was the whole mean.
            per = math_unary.where(kept, per, 0.0)
            mask = math.cast(kept, x.dtype)
            scale = mask if scale is None else scale * mask
        if scale is not None:
            per = per * scale
        if reduction == "mean" and scale is not None:
            return math.div(math.reduce_sum(per), math.reduce_sum(scale), name=name)
        return _reduce(per, reduction, name)


# ------------------------------------------------------------------ regression
def mean_squared_error(
    predictions: TensorLike, targets: TensorLike, reduction: Reduction = "mean", name: str = "loss"
) -> Tensor:
    """``(predictions - targets) ** 2`` over every element, reduced (by default the mean).

    ``targets`` has the predictions' shape, as every loss here asks: a (batch, 1) prediction against
    (batch,) targets would broadcast to a (batch, batch) table of every prediction against every target
    (PyTorch's ``mse_loss`` warns of that and goes on), so it is a ShapeError.

    Examples
    --------
    >>> import cellgraph as cg
    >>> g = cg.Graph()
    >>> with g.as_default():
    ...     loss = cg.losses.mean_squared_error(cg.constant([1.0, 2.0, 4.0]), cg.constant([1.0, 0.0, 1.0]))
    >>> float(cg.Session(g).run(loss))  # (0 + 4 + 9) / 3
    4.333333492279053
    """
    where = "mean_squared_error"
    _check_reduction(where, reduction)
    graph = graph_of([predictions, targets])
    with graph.as_default(), graph.atomic():
        given = _dtype_of(predictions)
        p = _float_input(where, "predictions", predictions)
        t = _float_input(where, "targets", targets, p.dtype, given)
        t = _same_shape(where, "targets", t, p, "predictions")
        return _reduce(math.square(p - t), reduction, name)


def huber(
    predictions: TensorLike,
    targets: TensorLike,
    delta: float = 1.0,
    reduction: Reduction = "mean",
    name: str = "loss",
) -> Tensor:
    """Huber loss: ``d^2 / 2`` where ``|d| <= delta``, else ``delta (|d| - delta / 2)``, for ``d = predictions - targets``.

    Written as ``q^2 / 2 + delta (|d| - q)`` with ``q = min(|d|, delta)``
    (TensorFlow's form; PyTorch's ``huber_loss``).

    Examples
    --------
    >>> import cellgraph as cg
    >>> g = cg.Graph()
    >>> with g.as_default():
    ...     loss = cg.losses.huber(cg.constant([0.5, 3.0]), cg.constant([0.0, 0.0]), reduction="none")
    >>> cg.Session(g).run(loss)
    array([0.125, 2.5  ], dtype=float32)
    """
    where = "huber"
    _check_reduction(where, reduction)
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not delta > 0 or delta == float("inf"):
        raise ValueError(f"{where}: delta must be a finite number more than 0, got {delta!r}")
    graph = graph_of([predictions, targets])
    with graph.as_default(), graph.atomic():
        given = _dtype_of(predictions)
        p = _float_input(where, "predictions", predictions)
        t = _float_input(where, "targets", targets, p.dtype, given)
        t = _same_shape(where, "targets", t, p, "predictions")
        size = math_unary.abs(p - t)
        q = math.minimum(size, float(delta))
        per = math.square(q) * 0.5 + (size - q) * float(delta)
        return _reduce(per, reduction, name)


def l2_loss(x: TensorLike, name: str = "l2_loss") -> Tensor:
    """``sum(x ** 2) / 2``, one scalar (TensorFlow's ``tf.nn.l2_loss``; weight decay is ``lambda * l2_loss(w)``).

    Examples
    --------
    >>> import cellgraph as cg
    >>> g = cg.Graph()
    >>> with g.as_default():
    ...     loss = cg.losses.l2_loss(cg.constant([1.0, 2.0]))
    >>> float(cg.Session(g).run(loss))
    2.5
    """
    graph = graph_of([x])
    with graph.as_default(), graph.atomic():
        t = _float_input("l2_loss", "x", x)
        return math.mul(math.reduce_sum(math.square(t)), 0.5, name=name)


__all__ = [
    "REDUCTIONS",
    "Reduction",
    "huber",
    "l2_loss",
    "mean_squared_error",
    "sigmoid_cross_entropy_with_logits",
    "softmax_cross_entropy_with_logits",
    "sparse_softmax_cross_entropy",
]


def __dir__() -> list[str]:
    """What ``cg.losses.<Tab>`` offers: its public names, not the modules and types it imports for itself."""
    return sorted(__all__)
