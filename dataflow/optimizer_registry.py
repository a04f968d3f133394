"""What each optimizer is, in one place: its slots, its hyperparameters and their rules, its update.

One ``OptimizerDef`` per kind. Everything that names an optimizer reads this
registry: the graph optimizers (``dataflow/optimizers.py``) and their
``Apply*`` ops (``dataflow/ops/training.py``), the parameter server's
``OptimizerConfig``, its protobuf form and its update table
(``cluster/ps``), and ``%train --optimizer``. The kind (``"adam"``) is the
name used everywhere; a hyperparameter's name is the same as a keyword of the
graph optimizer, a field of ``OptimizerConfig`` and of
``OptimizerConfigProto``, and an attribute of the ``Apply*`` op.

``update`` is the one function that changes a variable: the local ``Apply*``
op's CPU kernel and the parameter server both call it, so a variable trained
on a server moves exactly as it would locally.

Examples
--------
>>> import numpy as np
>>> adam = OPTIMIZER_KINDS.lookup("adam")
>>> adam.defaults()
{'learning_rate': 0.001, 'beta1': 0.9, 'beta2': 0.999, 'epsilon': 1e-08}
>>> adam.problem({"beta2": 1.0})
'beta2 must be in [0, 1), got 1.0'
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from .kernels.cpu import training as k
from .registry import Registry

Value = float | bool
# (variable, its slots by name, learning rate, gradient, hyperparameters) -> None: updates in place.
Update = Callable[[np.ndarray, Mapping[str, np.ndarray], "float | np.ndarray", np.ndarray, Mapping[str, Value]], None]


@dataclass(frozen=True)
class Rule:
    """A condition on a hyperparameter and the words that say it when it fails."""

    words: str
    holds: Callable[[float], bool]


# False for NaN and for an infinity: a NaN rate is accepted by every kernel and turns the model into NaN.
NONNEGATIVE = Rule("must be a finite number, 0 or more", lambda x: math.isfinite(x) and x >= 0)
# A decay rate: 1 would never forget (and divides by 0 in Adam's bias correction); False for NaN.
BELOW_ONE = Rule("must be in [0, 1)", lambda x: 0 <= x < 1)


@dataclass(frozen=True)
class Hyperparameter:
    """A named setting with its default and the rules it must meet (a flag has none)."""

    name: str
    default: Value
    rules: tuple[Rule, ...] = (NONNEGATIVE,)

    def problem(self, value: Value) -> str | None:
        """What is wrong with ``value`` (``'momentum must be ..., got 1.5'``), or None."""
        if isinstance(self.default, bool):
            return None if isinstance(value, (bool, np.bool_)) else f"{self.name} must be True or False, got {value!r}"
        for rule in self.rules:
            if not rule.holds(float(value)):
                return f"{self.name} {rule.words}, got {value}"
        return None


@dataclass(frozen=True)
class Slot:
    """A tensor an optimizer keeps per variable: the variable's shape, or a scalar (Adam's step count)."""

    name: str
    scalar: bool = False
    # The name of the Apply op's input that takes it, where it differs (ApplyMomentum's "accum").
    op_input: str | None = None

    @property
    def input(self) -> str:
        return self.op_input or self.name


@dataclass(frozen=True)
class OptimizerDef:
    """One optimizer kind: its name everywhere, its op, slots, hyperparameters and update."""

    kind: str
    op: str  # the Apply op that runs ``update`` in a graph
    slots: tuple[Slot, ...]
    hyperparameters: tuple[Hyperparameter, ...]  # learning_rate first
    update: Update

    def defaults(self) -> dict[str, Value]:
        return {h.name: h.default for h in self.hyperparameters}

    def names(self) -> tuple[str, ...]:
        """The hyperparameters but the learning rate (an input of the op, not an attribute)."""
        return tuple(h.name for h in self.hyperparameters if h.name != "learning_rate")

    def problem(self, values: Mapping[str, Value]) -> str | None:
        """The first broken rule among ``values`` (those given, by name), in declaration order, or None."""
        unknown = sorted(set(values) - {h.name for h in self.hyperparameters})
        if unknown:
            takes = ", ".join(h.name for h in self.hyperparameters)
            return f"it has no hyperparameter {', '.join(unknown)} (it takes {takes})"
        for h in self.hyperparameters:
            if h.name in values:
                found = h.problem(values[h.name])
                if found is not None:
                    return found
        return None


OPTIMIZER_KINDS: Registry[OptimizerDef] = Registry("optimizer")
_ORDER: list[str] = []  # the registry iterates sorted; messages list the kinds as registered


def register_optimizer(definition: OptimizerDef) -> OptimizerDef:
    OPTIMIZER_KINDS.register(definition.kind, definition, depth=2)
    _ORDER.append(definition.kind)
    return definition


def kinds() -> tuple[str, ...]:
    """Every optimizer kind, in the order registered (sgd first)."""
    return tuple(_ORDER)


# ------------------------------------------------------------------ the updates
# Each reads its slots by name and its hyperparameters from one mapping, so that
# the Apply op's kernel and the parameter server call them the same way.
def _sgd(var: np.ndarray, slots: Mapping[str, np.ndarray], lr: float | np.ndarray, grad: np.ndarray,
         hp: Mapping[str, Value]) -> None:  # fmt: skip
    k.sgd_update(var, lr, grad)


def _momentum(var: np.ndarray, slots: Mapping[str, np.ndarray], lr: float | np.ndarray, grad: np.ndarray,
              hp: Mapping[str, Value]) -> None:  # fmt: skip
    k.momentum_update(var, slots["momentum"], lr, grad, float(hp["momentum"]), bool(hp["nesterov"]))


def _adam(var: np.ndarray, slots: Mapping[str, np.ndarray], lr: float | np.ndarray, grad: np.ndarray,
          hp: Mapping[str, Value]) -> None:  # fmt: skip
    k.adam_update(var, slots["m"], slots["v"], slots["t"], lr, grad, float(hp["beta1"]), float(hp["beta2"]),
                  float(hp["epsilon"]), float(hp.get("weight_decay", 0.0)))  # fmt: skip


def _rmsprop(var: np.ndarray, slots: Mapping[str, np.ndarray], lr: float | np.ndarray, grad: np.ndarray,
             hp: Mapping[str, Value]) -> None:  # fmt: skip
    k.rmsprop_update(var, slots["ms"], slots["mom"], lr, grad, float(hp["decay"]), float(hp["momentum"]),
                     float(hp["epsilon"]))  # fmt: skip


def _adagrad(var: np.ndarray, slots: Mapping[str, np.ndarray], lr: float | np.ndarray, grad: np.ndarray,
             hp: Mapping[str, Value]) -> None:  # fmt: skip
    k.adagrad_update(var, slots["accumulator"], lr, grad, float(hp["initial_accumulator_value"]),
                     float(hp["epsilon"]))  # fmt: skip


def _rate(default: float) -> Hyperparameter:
    # 0 is allowed here (a parameter server may hold a frozen shard); a graph optimizer also asks for more than 0.
    return Hyperparameter("learning_rate", default)


# A momentum of 1 or more never forgets a gradient: checked after "finite, 0 or more", whose words the servers used.
_MOMENTUM_RULES = (NONNEGATIVE, BELOW_ONE)
_ADAM_HYPERPARAMETERS = (
    Hyperparameter("beta1", 0.9, (BELOW_ONE,)),
    Hyperparameter("beta2", 0.999, (BELOW_ONE,)),
    Hyperparameter("epsilon", 1e-8),
)
# Adam's step count "t" is a scalar per variable (float64 on a parameter server), counted before the step.
_ADAM_SLOTS = (Slot("m"), Slot("v"), Slot("t", scalar=True))

SGD = register_optimizer(OptimizerDef(
    "sgd", "ApplyGradientDescent", (), (_rate(0.01),), _sgd,
))  # fmt: skip
MOMENTUM = register_optimizer(OptimizerDef(
    "momentum", "ApplyMomentum", (Slot("momentum", op_input="accum"),),
    (_rate(0.01), Hyperparameter("momentum", 0.9, _MOMENTUM_RULES), Hyperparameter("nesterov", False)), _momentum,
))  # fmt: skip
ADAM = register_optimizer(OptimizerDef(
    "adam", "ApplyAdam", _ADAM_SLOTS, (_rate(1e-3), *_ADAM_HYPERPARAMETERS), _adam,
))  # fmt: skip
# TensorFlow's RMSProp: ms = decay ms + (1 - decay) g^2; mom = momentum mom + lr g / sqrt(ms + epsilon); var -= mom.
# Both slots start at zero (as in Keras and PyTorch; TF 1's slot "rms" started at one).
RMSPROP = register_optimizer(OptimizerDef(
    "rmsprop", "ApplyRMSProp", (Slot("ms"), Slot("mom")),
    (_rate(1e-3), Hyperparameter("decay", 0.9, (BELOW_ONE,)), Hyperparameter("momentum", 0.0, _MOMENTUM_RULES),
     Hyperparameter("epsilon", 1e-10)),
    _rmsprop,
))  # fmt: skip
# accum += g^2; var -= lr g / (sqrt(accum + initial_accumulator_value) + epsilon) (PyTorch's and Keras' form).
ADAGRAD = register_optimizer(OptimizerDef(
    "adagrad", "ApplyAdagrad", (Slot("accumulator"),),
    (_rate(0.01), Hyperparameter("initial_accumulator_value", 0.1), Hyperparameter("epsilon", 1e-7)), _adagrad,
))  # fmt: skip
# var *= 1 - lr weight_decay, then Adam's step (Loshchilov & Hutter 2019, as torch.optim.AdamW orders them).
ADAMW = register_optimizer(OptimizerDef(
    "adamw", "ApplyAdamW", _ADAM_SLOTS,
    (_rate(1e-3), *_ADAM_HYPERPARAMETERS, Hyperparameter("weight_decay", 0.01)), _adam,
))  # fmt: skip

__all__ = ["OPTIMIZER_KINDS", "Hyperparameter", "OptimizerDef", "Rule", "Slot", "kinds", "register_optimizer"]
