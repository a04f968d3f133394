"""Optimizers: SGD, Momentum (with Nesterov) and Adam, built from update ops.

``minimize`` = ``compute_gradients`` + ``apply_gradients``, as in TensorFlow.
Slots (momentum accumulators, Adam moments and step count) are variables named
after the variable they serve, so re-running a cell keeps them, and a later
issue can place them beside their variable on a parameter server.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .autodiff import gradients
from .errors import GradientError, GraphError
from .graph import Graph, Node, Tensor
from .ops import training
from .ops.state import assign_add, constant, group, variable


def _trainable_inputs(loss: Tensor) -> list[Tensor]:
    from .executor import schedule

    return [n.output(0) for n in schedule([loss], [], []) if n.op == "Variable" and n.attrs.get("trainable", True)]


class Optimizer:
    """Base class: subclasses say which slots they keep and which update op they apply."""

    name = "Optimizer"

    def __init__(self, learning_rate: float) -> None:
        if not learning_rate > 0:
            raise ValueError(f"{self.name}: learning_rate must be positive, got {learning_rate}")
        self.learning_rate = float(learning_rate)

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
        pairs = [(g, v) for g, v in grads_and_vars if g is not None]
        if not pairs:
            names = ", ".join(v.name for _, v in grads_and_vars)
            raise GradientError(f"{self.name}: no gradient flows to any of {names}")
        graph = pairs[0][1].graph
        for _, var in pairs:  # check every pair before building anything
            if var.node.op != "Variable":
                raise GraphError(f"{self.name}: can only update variables, not {var.node.describe()}")
        updates: list[Tensor | Node] = []
        with graph.atomic(), graph.name_scope(name or self.name):
            lrs: dict[str, Tensor] = {}
            slots_of: list[dict[str, Tensor]] = []
            for _, var in pairs:
                if var.dtype not in lrs:
                    lrs[var.dtype] = constant(self.learning_rate, dtype=var.dtype, name="learning_rate")
                slots_of.append({slot: self._slot(graph, var, slot, scalar) for slot, scalar in self.slots})
            # Every gradient of a step reads the values from before the step:
            # no update may run until all of them exist (b's gradient in
            # a * b reads a, so a's update must wait for it), as in PyTorch,
            # where optimizer.step() follows the whole backward pass.
            ready = group(*(grad for grad, _ in pairs), name="gradients_ready")
            with graph.control_dependencies([ready]):
                for (grad, var), var_slots in zip(pairs, slots_of):
                    updates.append(self._update(var, grad, lrs[var.dtype], var_slots))
            if global_step is not None:
                with graph.control_dependencies(updates):
                    return group(assign_add(global_step, 1), name="update")
            return group(*updates, name="update")

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

    def _slot(self, graph: Graph, var: Tensor, slot: str, scalar: bool = False) -> Tensor:
        if var.node.op != "Variable":
            raise GraphError(f"{self.name}: can only update variables, not {var.node.describe()}")
        shape = () if scalar else tuple(d for d in var.shape if d is not None)
        return variable(np.zeros(shape, var.dtype), dtype=var.dtype, name=f"{var.node.name}/{slot}", trainable=False)

    # The optimizer's slots: (name, whether the slot is a scalar), made for each variable.
    slots: tuple[tuple[str, bool], ...] = ()

    def _update(self, var: Tensor, grad: Tensor, lr: Tensor, slots: dict[str, Tensor]) -> Tensor:
        raise NotImplementedError


class SGD(Optimizer):
    """Plain stochastic gradient descent: ``var -= learning_rate * grad``."""

    name = "SGD"

    def _update(self, var: Tensor, grad: Tensor, lr: Tensor, slots: dict[str, Tensor]) -> Tensor:
        return training.apply_gradient_descent(var, lr, grad)


class Momentum(Optimizer):
    """SGD with momentum, optionally Nesterov's."""

    name = "Momentum"
    slots = (("momentum", False),)

    def __init__(self, learning_rate: float, momentum: float = 0.9, nesterov: bool = False) -> None:
        super().__init__(learning_rate)
        if not 0 <= momentum < 1:
            raise ValueError(f"Momentum: momentum must be in [0, 1), got {momentum}")
        self.momentum, self.nesterov = float(momentum), bool(nesterov)

    def _update(self, var: Tensor, grad: Tensor, lr: Tensor, slots: dict[str, Tensor]) -> Tensor:
        return training.apply_momentum(var, slots["momentum"], lr, grad, self.momentum, self.nesterov)


class Adam(Optimizer):
    """Adam (Kingma & Ba, 2015) with bias correction."""

    name = "Adam"
    slots = (("m", False), ("v", False), ("t", True))

    def __init__(
        self, learning_rate: float = 1e-3, beta1: float = 0.9, beta2: float = 0.999, epsilon: float = 1e-8
    ) -> None:
        super().__init__(learning_rate)
        for label, beta in (("beta1", beta1), ("beta2", beta2)):
            if not 0 <= beta < 1:
                raise ValueError(f"Adam: {label} must be in [0, 1), got {beta}")
        self.beta1, self.beta2, self.epsilon = float(beta1), float(beta2), float(epsilon)

    def _update(self, var: Tensor, grad: Tensor, lr: Tensor, slots: dict[str, Tensor]) -> Tensor:
        m, v, t = slots["m"], slots["v"], slots["t"]
        return training.apply_adam(var, m, v, t, lr, grad, self.beta1, self.beta2, self.epsilon)
