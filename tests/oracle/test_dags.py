"""Random graphs of 5 to 15 ops against torch: forward and every input's gradient.

Hypothesis draws a program (seeded: ``derandomize=True``, so every run checks
the same graphs) over elementwise, unary, binary, reduction, softmax and
matmul ops, wired so that shapes always fit: tensors are (n, 4), (1, 4),
(4,), (n, 1), () or (4, 4), with the batch dim ``n`` static or None, fed as
3, 1 or 0. A failing program prints as the lines it is made of.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from . import NO_TORCH

torch = pytest.importorskip("torch", reason=NO_TORCH)
nnf = torch.nn.functional

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import cellgraph as cg  # noqa: E402

from .harness import compare, torch_side, weights_like  # noqa: E402

Shape = tuple[int | str, ...]
F = 4  # the feature dim


def _bcast(a: Shape, b: Shape) -> Shape | None:
    """NumPy broadcasting where "n" (the batch, maybe 1, maybe 0) only meets "n" or a literal 1."""
    out: list[int | str] = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            return None
    return tuple(reversed(out))


@dataclass(frozen=True)
class Op:
    """One op of the menu: both sides of it, and the shape it makes from its operands' (None: not defined)."""

    name: str
    arity: int
    cg: Callable[..., Any]
    torch: Callable[..., Any]
    shape: Callable[..., Shape | None]


def _reduce(axis: int) -> Callable[[Shape], Shape | None]:
    return lambda s: s[:axis] + (1,) + s[axis + 1 :] if len(s) == 2 else None


def _same_2d(s: Shape) -> Shape | None:
    return s if len(s) == 2 else None


MENU = [
    Op("neg",      1, lambda a: -a,                          lambda a: -a,                          lambda s: s),
    Op("square",   1, cg.square,                             torch.square,                          lambda s: s),
    Op("tanh",     1, cg.tanh,                               torch.tanh,                            lambda s: s),
    Op("sigmoid",  1, cg.sigmoid,                            torch.sigmoid,                         lambda s: s),
    Op("relu",     1, cg.relu,                               torch.relu,                            lambda s: s),
    Op("exp_tanh", 1, lambda a: cg.exp(cg.tanh(a)),          lambda a: torch.exp(torch.tanh(a)),    lambda s: s),
    Op("log1p_sq", 1, lambda a: cg.log(cg.square(a) + 1.0),  lambda a: torch.log(a * a + 1.0),      lambda s: s),
    Op("sqrt1_sq", 1, lambda a: cg.sqrt(cg.square(a) + 1.0), lambda a: torch.sqrt(a * a + 1.0),     lambda s: s),
    Op("scale",    1, lambda a: a * 0.75 - 0.25,             lambda a: a * 0.75 - 0.25,             lambda s: s),
    Op("add",      2, lambda a, b: a + b,                    lambda a, b: a + b,                    _bcast),
    Op("sub",      2, lambda a, b: a - b,                    lambda a, b: a - b,                    _bcast),
    Op("mul",      2, lambda a, b: a * b,                    lambda a, b: a * b,                    _bcast),
    Op("div_safe", 2, lambda a, b: a / (cg.square(b) + 1.0), lambda a, b: a / (b * b + 1.0),        _bcast),
    Op("maximum",  2, cg.maximum,                            torch.maximum,                         _bcast),
    Op("minimum",  2, cg.minimum,                            torch.minimum,                         _bcast),
    # The second set of elementwise ops (ops/math_unary.py, ops/activations.py): smooth, or kinked only at 0.
    Op("sin",      1, cg.sin,                                torch.sin,                             lambda s: s),
    Op("erf",      1, cg.erf,                                torch.erf,                             lambda s: s),
    Op("rsqrt1_sq", 1, lambda a: cg.rsqrt(cg.square(a) + 1.0), lambda a: torch.rsqrt(a * a + 1.0),  lambda s: s),
    Op("gelu",     1, cg.gelu,                               nnf.gelu,                              lambda s: s),
    Op("gelu_tanh", 1, lambda a: cg.gelu(a, approximate=True), lambda a: nnf.gelu(a, approximate="tanh"), lambda s: s),
    Op("softplus", 1, cg.softplus,                           nnf.softplus,                          lambda s: s),
    Op("silu",     1, cg.silu,                               nnf.silu,                              lambda s: s),
    Op("softsign", 1, cg.softsign,                           nnf.softsign,                          lambda s: s),
    Op("elu",      1, cg.elu,                                nnf.elu,                               lambda s: s),
    Op("leaky",    1, lambda a: cg.leaky_relu(a, 0.1),       lambda a: nnf.leaky_relu(a, 0.1),      lambda s: s),
    Op("clip",     1, lambda a: cg.clip_by_value(a, -0.5, 0.5), lambda a: torch.clamp(a, -0.5, 0.5), lambda s: s),
    Op("where_pos", 2, lambda a, b: cg.where(a > 0.0, a, b), lambda a, b: torch.where(a > 0, a, b),  _bcast),
    Op("sum_1",    1, lambda a: cg.reduce_sum(a, 1, keepdims=True),  lambda a: a.sum(1, keepdim=True),  _reduce(1)),
    Op("sum_0",    1, lambda a: cg.reduce_sum(a, 0, keepdims=True),  lambda a: a.sum(0, keepdim=True),  _reduce(0)),
    Op("mean_1",   1, lambda a: cg.reduce_mean(a, 1, keepdims=True), lambda a: a.mean(1, keepdim=True), _reduce(1)),
    Op("max_1",    1, lambda a: cg.reduce_max(a, 1, keepdims=True),  lambda a: a.amax(1, keepdim=True), _reduce(1)),
    Op("sum_all",  1, lambda a: cg.reduce_sum(a),                    lambda a: a.sum(),                  lambda s: ()),
    Op("softmax",  1, cg.softmax, lambda a: torch.softmax(a, -1), lambda s: s if len(s) == 2 and s[1] == F else None),
    Op("matmul",   2, lambda a, w: a @ w, lambda a, w: a @ w,
       lambda a, w: (a[0], F) if len(a) == 2 and a[1] == F and w == (F, F) else None),
    Op("gram",     2, lambda a, b: cg.matmul(a, b, transpose_a=True), lambda a, b: a.T @ b,
       lambda a, b: (F, F) if a == ("n", F) and b == ("n", F) else None),
]  # fmt: skip
# Over an empty batch, the mean and max of axis 0 have no value (NaN, -inf) to compare; not drawn then.
ONLY_NONEMPTY = [
    Op("mean_0", 1, lambda a: cg.reduce_mean(a, 0, keepdims=True), lambda a: a.mean(0, keepdim=True), _reduce(0)),
    Op("max_0", 1, lambda a: cg.reduce_max(a, 0, keepdims=True), lambda a: a.amax(0, keepdim=True), _reduce(0)),
]
INPUTS: list[Shape] = [("n", F), ("n", F), (1, F), (F,), ("n", 1), (), (F, F)]


class Program:
    """Inputs t0.. of ``INPUTS``' shapes, then one op per step over earlier tensors."""

    def __init__(self, steps: tuple[tuple[Op, tuple[int, ...]], ...]) -> None:
        self.steps = steps

    def shapes(self) -> list[Shape]:
        shapes = list(INPUTS)
        for op, args in self.steps:
            shape = op.shape(*(shapes[a] for a in args))
            assert shape is not None
            shapes.append(shape)
        return shapes

    def sinks(self) -> list[int]:
        """Tensors made by a step and read by none: the outputs compared."""
        used = {a for _, args in self.steps for a in args}
        return [i for i in range(len(INPUTS), len(INPUTS) + len(self.steps)) if i not in used]

    def run(self, side: str, inputs: list[Any]) -> list[Any]:
        values = list(inputs)
        for op, args in self.steps:
            values.append(getattr(op, side)(*(values[a] for a in args)))
        return [values[i] for i in self.sinks()]

    def __repr__(self) -> str:
        lines = [f"t{i}: {s}" for i, s in enumerate(INPUTS)]
        for k, (op, args) in enumerate(self.steps):
            lines.append(f"t{len(INPUTS) + k} = {op.name}({', '.join(f't{a}' for a in args)})")
        return "Program:\n  " + "\n  ".join(lines)


@st.composite
def programs(draw: st.DrawFn, empty_batch: bool) -> Program:
    menu = MENU + ([] if empty_batch else ONLY_NONEMPTY)
    shapes = list(INPUTS)
    steps: list[tuple[Op, tuple[int, ...]]] = []
    for _ in range(draw(st.integers(5, 15))):
        while True:
            op = draw(st.sampled_from(menu))
            # Prefer recent tensors, so graphs get deep as well as wide.
            first = draw(st.sampled_from([len(shapes) - 1, len(shapes) - 2, *range(len(shapes))]))
            args = (first,)
            if op.arity == 2:
                fits = [j for j in range(len(shapes)) if op.shape(shapes[first], shapes[j]) is not None]
                if not fits:
                    continue
                args = (first, draw(st.sampled_from(fits)))
            shape = op.shape(*(shapes[a] for a in args))
            if shape is not None:
                break
        steps.append((op, args))
        shapes.append(shape)
    return Program(tuple(steps))


BATCHES = [
    pytest.param(3, False, id="static-n3"),
    pytest.param(3, True, id="none-n3"),
    pytest.param(1, True, id="none-n1"),
    pytest.param(0, True, id="none-n0"),
]
# No shrinking: a failing program (at most 15 lines) is readable as drawn, and
# shrinking one that fails inside a Numba compile costs a minute.
SETTINGS = settings(
    max_examples=12,
    derandomize=True,
    deadline=None,
    database=None,
    phases=(Phase.explicit, Phase.generate),
    suppress_health_check=list(HealthCheck),
)


def check_program(program: Program, batch: int, dynamic: bool, fuse: bool) -> None:
    rng = np.random.default_rng(len(program.steps) * 1000 + batch)
    shapes = [tuple(batch if d == "n" else d for d in s) for s in INPUTS]
    arrays = [rng.uniform(-1.0, 1.0, s) for s in shapes]
    g = cg.Graph()
    with g.as_default():
        tensors = [
            cg.placeholder(tuple(None if d == "n" and dynamic else c for d, c in zip(s, cs)), "float64", name=f"t{i}")
            for i, (s, cs) in enumerate(zip(INPUTS, shapes))
        ]
        outs = program.run("cg", tensors)
    want_shapes = [np.shape(v) for v in torch_side(lambda *t: program.run("torch", list(t)), arrays, None)[0]]
    weights = weights_like(rng, want_shapes)
    with g.as_default():
        ws = [cg.placeholder(o.shape, "float64", name=f"w{k}") for k, o in enumerate(outs)]
        probes = [o * w for o, w in zip(outs, ws)]
        loss = cg.reduce_sum(probes[0])
        for p in probes[1:]:
            loss = loss + cg.reduce_sum(p)
        grads = cg.gradients(loss, tensors)
    sess = cg.Session(g, fuse=fuse)
    feeds = {**dict(zip(tensors, arrays)), **dict(zip(ws, weights))}
    want_outs, want_grads = torch_side(lambda *t: program.run("torch", list(t)), arrays, weights)
    scale = [1 + np.abs(w).max(initial=0) for w in want_outs]
    # Forward only, each output read by nothing but its Mul: fusion may take whole chains in.
    for k, (got, want, w) in enumerate(zip(sess.run(probes, feeds), want_outs, weights)):
        compare(f"t{program.sinks()[k]} * weights, forward only", got, want * w, want.shape, 1e-9, 1e-10 * scale[k])
    values = sess.run([*outs, *[gr for gr in grads if gr is not None]], feeds)
    rest = iter(values[len(outs) :])
    got_grads = [None if gr is None else next(rest) for gr in grads]
    for k, (got, want) in enumerate(zip(values[: len(outs)], want_outs)):
        compare(f"output t{program.sinks()[k]}", got, want, want.shape, 1e-9, 1e-10 * scale[k])
    for i, (got, want) in enumerate(zip(got_grads, want_grads)):
        grad_scale = 1 + (0 if want is None else np.abs(want).max(initial=0))
        compare(f"gradient of t{i}", got, want, shapes[i], 1e-9, 1e-10 * grad_scale)


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize(("batch", "dynamic"), BATCHES)
def test_random_graph_matches_torch(batch: int, dynamic: bool, fuse: bool) -> None:
    @SETTINGS
    @given(programs(empty_batch=batch == 0))
    def check(program: Program) -> None:
        check_program(program, batch, dynamic, fuse)

    check()
