"""``placeholder_with_default``: an input that may be fed, and otherwise passes on a default.

TensorFlow's ``tf.compat.v1.placeholder_with_default``. Its node holds the
default as its one input and hands it on unchanged; feeding the node's output
replaces it for that run. ``shape`` may relax the default's shape (a ``None``
dim accepts any size in a feed), so ``placeholder_with_default(x_train[:1],
(None, 64))`` takes batches of any size. The gradient passes through to the
default, as Identity's does.

The use it is made for: a ``training`` switch, ``placeholder_with_default(True,
())``, that dropout and batch normalization take, so that one graph trains (the
default) and is evaluated by feeding ``False``.

>>> import cellgraph as cg
>>> g = cg.Graph()
>>> with g.as_default():
...     training = cg.placeholder_with_default(True, (), name="training")
>>> sess = cg.Session(g)
>>> bool(sess.run(training)), bool(sess.run(training, {training: False}))
(True, False)
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import ShapeError
from ..graph import Node, Tensor
from ..opdef import InferContext, OpDef, TensorSpec, register_op, simple_kernel
from ..shapes import fmt
from .base import TensorLike, apply, as_tensor, check_fits

FAMILY = "state"
Dys = list[Tensor | None]


def _infer(ctx: InferContext) -> TensorSpec:
    (default,) = ctx.inputs
    shape = tuple(ctx.attrs["shape"])
    check_fits(ctx, "the default", default, shape)
    return TensorSpec(shape, default.dtype)


def _grad(node: Node, dys: Dys) -> list[Tensor | None]:
    return [dys[0]]


# Device-agnostic, as Identity's: it hands on whatever array (host or device) it is given.
_pass_on = simple_kernel(lambda x: x)

register_op(OpDef(
    name="PlaceholderWithDefault", strings=True, family=FAMILY, infer=_infer, reference=lambda attrs, x: x, grad=_grad,
    kernels={"cpu": _pass_on, "cuda": _pass_on}, view=True,
))  # fmt: skip


def placeholder_with_default(
    default: TensorLike, shape: Sequence[int | None] | None = None, name: str = "placeholder_with_default"
) -> Tensor:
    """A tensor that is ``default`` unless a value is fed for it; ``shape`` (default: the default's)
    may have ``None`` dims where a fed value may differ from the default."""
    tensor = as_tensor(default)  # a Python value becomes a Const, as cg.constant makes it
    if shape is None:
        dims = tensor.shape
    else:
        dims = tuple(None if d is None or d == -1 else int(d) for d in shape)
        if any(d is not None and d < 0 for d in dims):
            raise ShapeError(f"placeholder_with_default {name!r}: negative dimension in shape {fmt(dims)}")
    return apply("PlaceholderWithDefault", [tensor], {"shape": dims}, name=name)


__all__ = ["placeholder_with_default"]
