"""Optimizers: SGD, Momentum (with Nesterov), Adam and AdamW (with AMSGrad), RMSProp (centered or not), Adagrad,
Adamax, Nadam and Adadelta, built from update ops.

``minimize`` = ``compute_gradients`` + ``apply_gradients``, as in TensorFlow.
Slots (momentum accumulators, Adam moments and step count) are variables named
after the variable they serve, so re-running a cell keeps them, and a later
issue can place them beside their variable on a parameter server.

What each kind is (slots, hyperparameters and their rules, update) lives in
``optimizer_registry.py``; a class here is that entry's constructor with typed
keywords.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from .autodiff import gradients
from .dtypes import is_half
from .errors import DTypeError, GradientError, GraphError
from .graph import Graph, Node, Tensor
from .ops import training
from .ops.math import add, cast, div, maximum, mul, reduce_sum, sqrt, square
from .ops.schedule import learning_rate_schedule
from .ops.state import assign_add, constant, group, variable
from .optimizer_registry import OPTIMIZER_KINDS, OptimizerDef, Value
from .schedules import Schedule


def _trainable_inputs(loss: Tensor) -> list[Tensor]:
    from .executor import schedule

    return [n.output(0) for n in schedule([loss], [], []) if n.op == "Variable" and n.attrs.get("trainable", True)]


class Optimizer:
    """Base class: a subclass names its registry entry (``kind``), whose slots it keeps and whose op it applies.

    One optimizer keeps one set of slots per variable: a second ``minimize`` or ``apply_gradients`` of a variable
    (a second loss trained by turns) continues the first one's moments and step count, as one ``torch.optim``
    optimizer does; two optimizer objects keep two sets.
    """

    name = "Optimizer"
    kind: ClassVar[str] = ""

    def __init__(self, learning_rate: float | Schedule, **hyperparameters: Value) -> None:
        # Each variable's slots, made at its first update: a second minimize or apply_gradients of the same
        # variable by this optimizer continues them, as one torch.optim optimizer (and a TensorFlow 1 one) keeps
        # one state per parameter. Each call made its own before, so training a variable on two losses by
        # turns kept two Adam moments and step counts, each seeing half the steps, without a word.
        self._slots: dict[Node, dict[str, Tensor]] = {}
        given: dict[str, Value] = dict(hyperparameters)
        if isinstance(learning_rate, Schedule):
            # A schedule checked its own fields when it was made (a warm-up may well start at 0).
            self.learning_rate: float | Schedule = learning_rate
        else:
            # Locally a rate of 0 is a mistake (nothing moves), so more than 0 here; the registry's rules follow.
            if not learning_rate > 0:
                raise ValueError(f"{self.name}: learning_rate must be positive, got {learning_rate}")
            given["learning_rate"] = learning_rate
            self.learning_rate = float(learning_rate)
        problem = self.definition.problem(given)
        if problem is not None:
            raise ValueError(f"{self.name}: {problem}")
        for hyper in self.definition.hyperparameters[1:]:
            value = hyperparameters.get(hyper.name, hyper.default)
            setattr(self, hyper.name, bool(value) if isinstance(hyper.default, bool) else float(value))

    @property
    def definition(self) -> OptimizerDef:
        return OPTIMIZER_KINDS.lookup(self.kind)

    @property
    def hyperparameters(self) -> dict[str, Value]:
        """Every hyperparameter but the learning rate, by its registry name: ``{"beta1": 0.9, ...}``."""
        return {name: getattr(self, name) for name in self.definition.names()}

    def __repr__(self) -> str:
        shown = {"learning_rate": self.learning_rate, **self.definition.shown(self.hyperparameters)}
        settings = ", ".join(f"{k}={v!r}" for k, v in shown.items())
        return f"{type(self).__name__}({settings})"

    def compute_gradients(
        self, loss: Tensor, var_list: Sequence[Tensor] | None = None
    ) -> list[tuple[Tensor | None, Tensor]]:
        """``(gradient, variable)`` pairs for every trainable variable ``loss`` depends on."""
        variables = list(var_list) if var_list is not None else _trainable_inputs(loss)
        if not variables:
            raise GradientError(f"{self.name}: {loss.name!r} depends on no trainable variable; nothing to optimise")
        return list(zip(gradients(loss, variables), variables))

    def apply_gradients(
        self,
        grads_and_vars: Sequence[tuple[Tensor | None, Tensor]],
        global_step: Tensor | None = None,
        name: str | None = None,
    ) -> Node:
        """One node that applies every update (and increments ``global_step``)."""
        pairs = self._checked(grads_and_vars, global_step)
        graph = pairs[0][1].graph
        with graph.atomic(), graph.name_scope(name or self.name):
            lrs, slots_of = self._rates_and_slots(graph, pairs, global_step)
            updates: list[Tensor | Node] = list(self._updates(pairs, lrs, slots_of))
            if global_step is not None:
                with graph.control_dependencies(updates):
                    return group(assign_add(global_step, 1), name="update")
            return group(*updates, name="update")

    def _checked(
        self, grads_and_vars: Sequence[tuple[Tensor | None, Tensor]], global_step: Tensor | None
    ) -> list[tuple[Tensor, Tensor]]:
        """The pairs with a gradient, once every one is known to be updatable (nothing built yet)."""
        pairs = [(g, v) for g, v in grads_and_vars if g is not None]
        if not pairs:
            names = ", ".join(v.name for _, v in grads_and_vars)
            raise GradientError(f"{self.name}: no gradient flows to any of {names}")
        for _, var in pairs:  # check every pair before building anything
            if var.node.op != "Variable":
                raise GraphError(f"{self.name}: can only update variables, not {var.node.describe()}")
            if is_half(var.dtype):
                # The updates would round every step's small change away in half precision.
                raise DTypeError(
                    f"{self.name}: variable {var.node.name!r} is {var.dtype}; optimizers update float32 or float64 "
                    "variables: keep it float32 and train with cg.optim.mixed_precision (float32 master weights, "
                    f"{var.dtype} compute)"
                )
        seen: set[Node] = set()
        for _, var in pairs:
            # Two updates of one variable in one step: SGD's two steps add up to the summed gradient's, but Adam's
            # (or any kind with slots) are two steps, its step count moved twice; no torch.optim step does either.
            if var.node in seen:
                raise GraphError(
                    f"{self.name}: variable {var.node.name!r} has two gradients in one apply_gradients; one step "
                    "applies one gradient per variable: add them first (cg.add(g1, g2)), or give each loss its "
                    "own training op"
                )
            seen.add(var.node)
        if isinstance(self.learning_rate, Schedule) and global_step is None:
            raise GraphError(
                f"{self.name}: learning rate {self.learning_rate!r} is a schedule of the global step; pass "
                "global_step= (a scalar int variable, trainable=False) to minimize or apply_gradients"
            )
        return pairs

    def _rates_and_slots(
        self, graph: Graph, pairs: Sequence[tuple[Tensor, Tensor]], global_step: Tensor | None
    ) -> tuple[dict[str, Tensor], list[dict[str, Tensor]]]:
        """The learning rate of each variable dtype, and each variable's slots by slot name."""
        lrs: dict[str, Tensor] = {}
        slots_of: list[dict[str, Tensor]] = []
        for _, var in pairs:
            if var.dtype not in lrs:
                lrs[var.dtype] = self._learning_rate(global_step, var.dtype)
            slots_of.append(self._slots_of(graph, var))
        return lrs, slots_of

    def _slots_of(self, graph: Graph, var: Tensor) -> dict[str, Tensor]:
        """``var``'s slots by slot name: those this optimizer made for it while they are still in ``graph`` (a
        re-run cell or a rejected build takes them out), else new ones."""
        known = self._slots.get(var.node)
        if known is not None and all(slot in graph for slot in known.values()):
            return known
        kept = self.definition.slots_for(self.hyperparameters)  # a flag may add one (amsgrad's vhat)
        made = {s.name: self._slot(graph, var, s.name, s.scalar) for s in kept}
        self._slots[var.node] = made
        return made

    def _updates(
        self,
        pairs: Sequence[tuple[Tensor, Tensor]],
        lrs: dict[str, Tensor],
        slots_of: Sequence[dict[str, Tensor]],
        after: Sequence[Tensor | Node] = (),
    ) -> list[Tensor]:
        """One update per pair, none of which runs before every gradient (and ``after``) exists."""
        graph = pairs[0][1].graph
        # Every gradient of a step reads the values from before the step:
        # no update may run until all of them exist (b's gradient in
        # a * b reads a, so a's update must wait for it), as in PyTorch,
        # where optimizer.step() follows the whole backward pass.
        ready = group(*(grad for grad, _ in pairs), *after, name="gradients_ready")
        with graph.control_dependencies([ready]):
            return [self._update(var, grad, lrs[var.dtype], slots) for (grad, var), slots in zip(pairs, slots_of)]

    def minimize(
        self, loss: Tensor, var_list: Sequence[Tensor] | None = None, global_step: Tensor | None = None
    ) -> Node:
        """The training op: run it once per step.

        Examples
        --------
        >>> import cellgraph as cg
        >>> g = cg.Graph()
        >>> with g.as_default():
        ...     w = cg.variable([3.0], name="w")
        ...     train = cg.optim.SGD(0.25).minimize(cg.reduce_sum(w * w))
        >>> sess = cg.Session(g)
        >>> _ = sess.run(train)
        >>> sess.run(w)
        array([1.5], dtype=float32)
        """
        with loss.graph.atomic():  # a rejected minimize leaves no gradient nodes behind
            return self.apply_gradients(self.compute_gradients(loss, var_list), global_step)

    def _learning_rate(self, global_step: Tensor | None, dtype: str) -> Tensor:
        """The step's rate as a ``dtype`` scalar: a constant, or the schedule's value at ``global_step``
        (read before this step's ``assign_add``, which waits for every update)."""
        if isinstance(self.learning_rate, Schedule):
            assert global_step is not None  # apply_gradients refused a schedule without one
            return learning_rate_schedule(self.learning_rate, global_step, dtype, name="learning_rate")
        return constant(self.learning_rate, dtype=dtype, name="learning_rate")

    def _slot(self, graph: Graph, var: Tensor, slot: str, scalar: bool = False) -> Tensor:
        if var.node.op != "Variable":
            raise GraphError(f"{self.name}: can only update variables, not {var.node.describe()}")
        shape = () if scalar else tuple(d for d in var.shape if d is not None)
        return variable(np.zeros(shape, var.dtype), dtype=var.dtype, name=f"{var.node.name}/{slot}", trainable=False)

    def _update(self, var: Tensor, grad: Tensor, lr: Tensor, slots: dict[str, Tensor]) -> Tensor:
        return training.apply_optimizer(self.kind, var, slots, lr, grad, self.hyperparameters)


class SGD(Optimizer):
    """Plain stochastic gradient descent: ``var -= learning_rate * grad``."""

    name, kind = "SGD", "sgd"

    def __init__(self, learning_rate: float | Schedule) -> None:
        super().__init__(learning_rate)


class Momentum(Optimizer):
    """SGD with momentum, optionally Nesterov's."""

    name, kind = "Momentum", "momentum"
    momentum: float
    nesterov: bool

    def __init__(self, learning_rate: float | Schedule, momentum: float = 0.9, nesterov: bool = False) -> None:
        super().__init__(learning_rate, momentum=momentum, nesterov=nesterov)


class Adam(Optimizer):
    """Adam (Kingma & Ba, 2015) with bias correction, epsilon placed as TensorFlow places it.

    ``m = beta1 m + (1 - beta1) g``, ``v = beta2 v + (1 - beta2) g^2``, ``lr_t = lr sqrt(1 - beta2^t) /
    (1 - beta1^t)``, ``var -= lr_t m / (sqrt(v) + epsilon)`` (t counts this variable's steps from 1).
    ``torch.optim.Adam`` adds its ``eps`` to the bias-corrected ``sqrt(v / (1 - beta2^t))`` instead: the
    two agree at ``epsilon = 0``, and otherwise this ``epsilon`` is torch's ``eps * sqrt(1 - beta2^t)``.

    ``amsgrad=True`` (Reddi et al., 2018; TensorFlow's ApplyAdamWithAmsgrad) keeps a slot ``vhat``, the
    largest ``v`` seen, and divides by ``sqrt(vhat) + epsilon`` instead: ``torch.optim.Adam(amsgrad=True)``
    with the same relation between the two epsilons.
    """

    name, kind = "Adam", "adam"
    beta1: float
    beta2: float
    epsilon: float
    amsgrad: bool

    def __init__(
        self,
        learning_rate: float | Schedule = 1e-3,
        beta1: float = 0.9,
        beta2: float = 0.999,
        epsilon: float = 1e-8,
        amsgrad: bool = False,
    ) -> None:
        super().__init__(learning_rate, beta1=beta1, beta2=beta2, epsilon=epsilon, amsgrad=amsgrad)


class AdamW(Optimizer):
    """Adam with decoupled weight decay (Loshchilov & Hutter, 2019): ``var *= 1 - lr * weight_decay``, then Adam.

    As ``torch.optim.AdamW`` orders them (``lr`` the step's rate, a schedule's value included); the Adam step
    places epsilon as :class:`Adam` does (TensorFlow's way, not torch's), AMSGrad's too (``amsgrad=True``).
    """

    name, kind = "AdamW", "adamw"
    beta1: float
    beta2: float
    epsilon: float
    weight_decay: float
    amsgrad: bool

    def __init__(
        self,
        learning_rate: float | Schedule = 1e-3,
        beta1: float = 0.9,
        beta2: float = 0.999,
        epsilon: float = 1e-8,
        weight_decay: float = 0.01,
        amsgrad: bool = False,
    ) -> None:
        super().__init__(
            learning_rate, beta1=beta1, beta2=beta2, epsilon=epsilon, weight_decay=weight_decay, amsgrad=amsgrad
        )


class RMSProp(Optimizer):
    """RMSProp as TensorFlow runs it: ``ms = decay ms + (1 - decay) g^2``, ``mom = momentum mom +
    lr g / sqrt(ms + epsilon)``, ``var -= mom`` (every slot starts at zero).

    ``centered=True`` (TensorFlow's ApplyCenteredRMSProp) also averages the gradient, ``mg = decay mg +
    (1 - decay) g``, and divides by ``sqrt(ms - mg^2 + epsilon)``. ``torch.optim.RMSprop`` (``alpha`` is
    ``decay``) adds its ``eps`` outside the square root and multiplies by ``lr`` after the momentum: the two
    agree at ``epsilon = 0`` under a constant rate.
    """

    name, kind = "RMSProp", "rmsprop"
    decay: float
    momentum: float
    epsilon: float
    centered: bool

    def __init__(
        self,
        learning_rate: float | Schedule = 1e-3,
        decay: float = 0.9,
        momentum: float = 0.0,
        epsilon: float = 1e-10,
        centered: bool = False,
    ) -> None:
        super().__init__(learning_rate, decay=decay, momentum=momentum, epsilon=epsilon, centered=centered)


class Adagrad(Optimizer):
    """Adagrad (Duchi et al., 2011): ``var -= lr g / (sqrt(initial_accumulator_value + sum g^2) + epsilon)``."""

    name, kind = "Adagrad", "adagrad"
    initial_accumulator_value: float
    epsilon: float

    def __init__(
        self, learning_rate: float | Schedule = 0.01, initial_accumulator_value: float = 0.1, epsilon: float = 1e-7
    ) -> None:
        super().__init__(learning_rate, initial_accumulator_value=initial_accumulator_value, epsilon=epsilon)


class Adamax(Optimizer):
    """Adamax (Kingma & Ba, 2015, section 7.1), Adam under the infinity norm, as TensorFlow's ApplyAdaMax:
    ``m = beta1 m + (1 - beta1) g``, ``u = max(beta2 u, |g|)``, ``var -= lr / (1 - beta1^t) m / (u + epsilon)``.

    ``torch.optim.Adamax`` adds its ``eps`` to ``|g|`` inside the maximum instead: the two agree at
    ``epsilon = 0`` (no exact conversion otherwise). The defaults are the paper's and torch's.
    """

    name, kind = "Adamax", "adamax"
    beta1: float
    beta2: float
    epsilon: float

    def __init__(
        self, learning_rate: float | Schedule = 2e-3, beta1: float = 0.9, beta2: float = 0.999, epsilon: float = 1e-8
    ) -> None:
        super().__init__(learning_rate, beta1=beta1, beta2=beta2, epsilon=epsilon)


class Nadam(Optimizer):
    """Nadam (Dozat, 2016): Adam with Nesterov momentum, on ``torch.optim.NAdam``'s and Keras' schedule.

    ``mu_t = beta1 (1 - 0.96^(t momentum_decay) / 2)``, ``P_t = mu_1 ... mu_t``; ``m`` and ``v`` as in Adam;
    ``var -= lr sqrt(1 - beta2^t) ((1 - mu_t) / (1 - P_t) g + mu_(t+1) / (1 - P_t mu_(t+1)) m) /
    (sqrt(v) + epsilon)``. Epsilon is placed as :class:`Adam` places it: torch and Keras add theirs to
    ``sqrt(v / (1 - beta2^t))``, so this ``epsilon`` is their ``eps * sqrt(1 - beta2^t)`` (equal at 0). The
    slots are ``m``, ``v``, the step count ``t`` and the product ``mu_product``.
    """

    name, kind = "Nadam", "nadam"
    beta1: float
    beta2: float
    epsilon: float
    momentum_decay: float

    def __init__(
        self,
        learning_rate: float | Schedule = 2e-3,
        beta1: float = 0.9,
        beta2: float = 0.999,
        epsilon: float = 1e-8,
        momentum_decay: float = 4e-3,
    ) -> None:
        super().__init__(learning_rate, beta1=beta1, beta2=beta2, epsilon=epsilon, momentum_decay=momentum_decay)


class Adadelta(Optimizer):
    """Adadelta (Zeiler, 2012), as TensorFlow, Keras and ``torch.optim.Adadelta`` all write it:
    ``accum = rho accum + (1 - rho) g^2``, ``d = sqrt(accum_update + epsilon) / sqrt(accum + epsilon) g``,
    ``accum_update = rho accum_update + (1 - rho) d^2``, ``var -= lr d``. The defaults are torch's
    (``learning_rate=1.0``: the method needs none).
    """

    name, kind = "Adadelta", "adadelta"
    rho: float
    epsilon: float

    def __init__(self, learning_rate: float | Schedule = 1.0, rho: float = 0.9, epsilon: float = 1e-6) -> None:
        super().__init__(learning_rate, rho=rho, epsilon=epsilon)


# The graph optimizer of each registry kind: %train --optimizer and the job's config read it.
CLASSES: dict[str, type[Optimizer]] = {
    cls.kind: cls for cls in (SGD, Momentum, Adam, AdamW, RMSProp, Adagrad, Adamax, Nadam, Adadelta)
}


def optimizer_class(kind: str) -> type[Optimizer]:
    """The graph optimizer class of registry kind ``kind`` (``"adam"`` -> ``Adam``)."""
    OPTIMIZER_KINDS.lookup(kind)  # an unknown kind: the registry's error, listing the known ones
    return CLASSES[kind]


def clip_by_global_norm(
    tensors: Sequence[Tensor | None], clip_norm: float, name: str = "clip_by_global_norm"
) -> tuple[list[Tensor | None], Tensor]:
    """Scale ``tensors`` together so that their joint L2 norm is at most ``clip_norm``; ``(clipped, global_norm)``.

    ``t * clip_norm / max(global_norm, clip_norm)`` for each, with ``global_norm
    = sqrt(sum of every element squared)``, as ``tf.clip_by_global_norm`` and
    ``torch.nn.utils.clip_grad_norm_`` (up to its 1e-6) do. ``None`` entries
    (a variable no gradient reaches) stay ``None``. Use it between
    ``compute_gradients`` and ``apply_gradients``.

    Examples
    --------
    >>> import cellgraph as cg
    >>> g = cg.Graph()
    >>> with g.as_default():
    ...     (clipped,), norm = cg.optim.clip_by_global_norm([cg.constant([3.0, 4.0])], 1.0)
    >>> cg.Session(g).run([clipped, norm])
    [array([0.6, 0.8], dtype=float32), array(5., dtype=float32)]
    """
    present = [t for t in tensors if t is not None]
    if not present:
        raise GraphError(f"{name}: no tensor to clip (every entry is None)")
    if not (math.isfinite(clip_norm) and clip_norm > 0):
        raise ValueError(f"{name}: clip_norm must be a finite number more than 0, got {clip_norm}")
    dtype = present[0].dtype
    for t in present:
        if t.dtype not in ("float16", "bfloat16", "float32", "float64"):
            raise DTypeError(f"{name}: {t.name!r} has dtype {t.dtype}; only floating-point tensors can be clipped")
        if t.dtype != dtype:
            raise DTypeError(
                f"{name}: {t.name!r} has dtype {t.dtype} and {present[0].name!r} has {dtype}; all must share one dtype"
            )
    graph = present[0].graph
    # Half tensors are squared and summed in float32: a float16 gradient of 300 squared is inf in float16, and
    # an inf norm scaled every gradient to 0 (PyTorch's vector_norm accumulates a half tensor in float32 too).
    wide = "float32" if is_half(dtype) else dtype
    widen = (lambda t: cast(t, wide)) if wide != dtype else (lambda t: t)
    with graph.atomic(), graph.name_scope(name):
        total = reduce_sum(square(widen(present[0])))
        for t in present[1:]:
            total = add(total, reduce_sum(square(widen(t))))
        norm = sqrt(total, name="global_norm")
        limit = constant(clip_norm, dtype=wide, name="clip_norm")
        # clip_norm / max(norm, clip_norm): 1 when within the bound, and never a division by 0.
        scale = div(limit, maximum(norm, limit), name="scale")
        if wide != dtype:
            scale, norm = cast(scale, dtype, name="scale_half"), cast(norm, dtype, name="global_norm_half")
        clipped = [None if t is None else mul(t, scale, name="clipped") for t in tensors]
    return clipped, norm


__all__ = [
    "CLASSES",
    "SGD",
    "Adadelta",
    "Adagrad",
    "Adam",
    "AdamW",
    "Adamax",
    "Momentum",
    "Nadam",
    "Optimizer",
    "RMSProp",
    "clip_by_global_norm",
    "optimizer_class",
]
