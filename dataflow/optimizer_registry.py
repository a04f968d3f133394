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
{'learning_rate': 0.001, 'beta1': 0.9, 'beta2': 0.999, 'epsilon': 1e-08, 'amsgrad': False}
>>> adam.problem({"beta2": 1.0})
'beta2 must be in [0, 1), got 1.0'

A flag (a bool hyperparameter) may keep a slot more: ``Slot.when`` names it.

>>> [slot.name for slot in adam.slots_for({"amsgrad": True})]
['m', 'v', 't', 'vhat']
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
# Adadelta's rho: 1 keeps both averages at zero (each step is then lr g), which divides by nothing; False for NaN.
UNIT = Rule("must be in [0, 1]", lambda x: 0 <= x <= 1)


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
    # The flag (a bool hyperparameter) without which the slot is not kept: AMSGrad's "vhat" needs "amsgrad".
    when: str | None = None

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

    def slots_for(self, values: Mapping[str, Value]) -> tuple[Slot, ...]:
        """The slots kept with these hyperparameters (by name; a flag not given takes its default)."""
        flags = self.defaults() | dict(values)
        return tuple(s for s in self.slots if s.when is None or bool(flags[s.when]))

    def names(self) -> tuple[str, ...]:
        """The hyperparameters but the learning rate (an input of the op, not an attribute)."""
        return tuple(h.name for h in self.hyperparameters if h.name != "learning_rate")

    def shown(self, values: Mapping[str, Value]) -> dict[str, Value]:
        """``values`` as a repr shows them: a flag that only adds a slot (amsgrad, centered) when it is set."""
        optional = {s.when for s in self.slots if s.when is not None}
        defaults = self.defaults()
        return {k: v for k, v in values.items() if k not in optional or v != defaults[k]}

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
                  float(hp["epsilon"]), float(hp.get("weight_decay", 0.0)),
                  slots["vhat"] if hp.get("amsgrad") else None)  # fmt: skip


def _rmsprop(var: np.ndarray, slots: Mapping[str, np.ndarray], lr: float | np.ndarray, grad: np.ndarray,
             hp: Mapping[str, Value]) -> None:  # fmt: skip
    k.rmsprop_update(var, slots["ms"], slots["mom"], lr, grad, float(hp["decay"]), float(hp["momentum"]),
                     float(hp["epsilon"]), slots["mg"] if hp.get("centered") else None)  # fmt: skip


def _adagrad(var: np.ndarray, slots: Mapping[str, np.ndarray], lr: float | np.ndarray, grad: np.ndarray,
             hp: Mapping[str, Value]) -> None:  # fmt: skip
    k.adagrad_update(var, slots["accumulator"], lr, grad, float(hp["initial_accumulator_value"]),
                     float(hp["epsilon"]))  # fmt: skip


def _adamax(var: np.ndarray, slots: Mapping[str, np.ndarray], lr: float | np.ndarray, grad: np.ndarray,
            hp: Mapping[str, Value]) -> None:  # fmt: skip
    k.adamax_update(var, slots["m"], slots["u"], slots["t"], lr, grad, float(hp["beta1"]), float(hp["beta2"]),
                    float(hp["epsilon"]))  # fmt: skip


def _nadam(var: np.ndarray, slots: Mapping[str, np.ndarray], lr: float | np.ndarray, grad: np.ndarray,
           hp: Mapping[str, Value]) -> None:  # fmt: skip
    k.nadam_update(var, slots["m"], slots["v"], slots["t"], slots["mu_product"], lr, grad, float(hp["beta1"]),
                   float(hp["beta2"]), float(hp["epsilon"]), float(hp["momentum_decay"]))  # fmt: skip


def _adadelta(var: np.ndarray, slots: Mapping[str, np.ndarray], lr: float | np.ndarray, grad: np.ndarray,
              hp: Mapping[str, Value]) -> None:  # fmt: skip
    k.adadelta_update(var, slots["accum"], slots["accum_update"], lr, grad, float(hp["rho"]), float(hp["epsilon"]))


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
# With amsgrad (Reddi et al., 2018), "vhat" keeps the largest v seen, and the step divides by its root.
_ADAM_SLOTS = (Slot("m"), Slot("v"), Slot("t", scalar=True), Slot("vhat", when="amsgrad"))
_AMSGRAD = Hyperparameter("amsgrad", False)

SGD = register_optimizer(OptimizerDef(
    "sgd", "ApplyGradientDescent", (), (_rate(0.01),), _sgd,
))  # fmt: skip
MOMENTUM = register_optimizer(OptimizerDef(
    "momentum", "ApplyMomentum", (Slot("momentum", op_input="accum"),),
    (_rate(0.01), Hyperparameter("momentum", 0.9, _MOMENTUM_RULES), Hyperparameter("nesterov", False)), _momentum,
))  # fmt: skip
ADAM = register_optimizer(OptimizerDef(
    "adam", "ApplyAdam", _ADAM_SLOTS, (_rate(1e-3), *_ADAM_HYPERPARAMETERS, _AMSGRAD), _adam,
))  # fmt: skip
# TensorFlow's RMSProp: ms = decay ms + (1 - decay) g^2; mom = momentum mom + lr g / sqrt(ms + epsilon); var -= mom.
# Every slot starts at zero (as in Keras and PyTorch; TF 1's slot "rms" started at one). Centered (TensorFlow's
# ApplyCenteredRMSProp), "mg" averages g as ms averages g^2, and the root is of ms - mg^2 + epsilon.
RMSPROP = register_optimizer(OptimizerDef(
    "rmsprop", "ApplyRMSProp", (Slot("ms"), Slot("mg", when="centered"), Slot("mom")),
    (_rate(1e-3), Hyperparameter("decay", 0.9, (BELOW_ONE,)), Hyperparameter("momentum", 0.0, _MOMENTUM_RULES),
     Hyperparameter("epsilon", 1e-10), Hyperparameter("centered", False)),
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
    (_rate(1e-3), *_ADAM_HYPERPARAMETERS, Hyperparameter("weight_decay", 0.01), _AMSGRAD), _adam,
))  # fmt: skip
# TensorFlow's ApplyAdaMax: m as Adam's; u = max(beta2 u, |g|); var -= lr / (1 - beta1^t) m / (u + epsilon).
ADAMAX = register_optimizer(OptimizerDef(
    "adamax", "ApplyAdaMax", (Slot("m"), Slot("u"), Slot("t", scalar=True)),
    (_rate(2e-3), *_ADAM_HYPERPARAMETERS), _adamax,
))  # fmt: skip
# Adam with Nesterov momentum on torch's and Keras' schedule mu_t = beta1 (1 - 0.96^(t momentum_decay) / 2);
# "mu_product" is that schedule's running product (a scalar, as "t" is). Epsilon is added to sqrt(v) as in Adam.
NADAM = register_optimizer(OptimizerDef(
    "nadam", "ApplyNadam", (Slot("m"), Slot("v"), Slot("t", scalar=True), Slot("mu_product", scalar=True)),
    (_rate(2e-3), *_ADAM_HYPERPARAMETERS, Hyperparameter("momentum_decay", 4e-3)), _nadam,
))  # fmt: skip
# accum = rho accum + (1 - rho) g^2; d = sqrt(accum_update + epsilon) / sqrt(accum + epsilon) g;
# accum_update = rho accum_update + (1 - rho) d^2; var -= lr d (TensorFlow's ApplyAdadelta, torch's Adadelta).
ADADELTA = register_optimizer(OptimizerDef(
    "adadelta", "ApplyAdadelta", (Slot("accum"), Slot("accum_update")),
    (_rate(1.0), Hyperparameter("rho", 0.9, (UNIT,)), Hyperparameter("epsilon", 1e-6)), _adadelta,
))  # fmt: skip

__all__ = ["OPTIMIZER_KINDS", "Hyperparameter", "OptimizerDef", "Rule", "Slot", "kinds", "register_optimizer"]
