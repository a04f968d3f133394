"""The cases of the ONNX import sweep, elementwise ops and reductions: for each swept row of
``IMPORTERS``, every version ONNX Runtime runs (from the row's ``since``), every dtype that version
allows, and the attribute values the row reads, at their edges (negative axes, keepdims=0,
select_last_index, broadcasting, empty dims). ``FAMILIES`` is the table of every swept op.

Values come from a seeded generator, with each dtype's edges mixed in: the integer extremes, and
NaN, infinities and -0.0 for floats. A case that expects another value than ONNX Runtime's says why.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from .onnx_sweep import FLOATS, Case, Cases, Const, allowed, since, tolerance, values
from .onnx_sweep_array_cases import ARRAY_FAMILIES
from .onnx_sweep_model_cases import MODEL_FAMILIES
from .onnx_sweep_nn_cases import NN_FAMILIES
from .onnx_sweep_window_cases import WINDOW_FAMILIES

# ------------------------------------------------------------------ elementwise
SHAPES = [((2, 3), (2, 3)), ((2, 1, 3), (4, 1)), ((3,), ()), ((0, 3), (1, 3))]
# Signed integer overflow is undefined in ONNX (C++): sums and products stay in range.
WRAPS = ("Add", "Sub", "Mul", "Sum", "Mean")


def binary(op: str, rng: np.random.Generator) -> Cases:
    for version in since(op):
        for dtype in allowed(op, version, "T"):
            shapes = SHAPES if version >= 7 else SHAPES[:1]
            for sa, sb in shapes:
                edges = dtype in FLOATS or op not in WRAPS
                a, b = values(rng, dtype, sa, special=edges), values(rng, dtype, sb, special=edges)
                yield Case(op, version, [a, b], **tolerance(dtype))
            if op in ("Max", "Min", "Sum", "Mean") and version >= 8:
                a = values(rng, dtype, (2, 3), special=op in ("Max", "Min"))
                yield Case(op, version, [a, values(rng, dtype, (3,), False), values(rng, dtype, (2, 1), False)],
                           **tolerance(dtype))  # fmt: skip
                yield Case(op, version, [a], **tolerance(dtype))


def div(rng: np.random.Generator) -> Cases:
    for version in since("Div"):
        for dtype in allowed("Div", version, "T"):
            a = values(rng, dtype, (2, 3))
            b = values(rng, dtype, (3,), special=dtype in FLOATS)
            if dtype not in FLOATS:
                b[b == 0] = 3
                b[b == -1] = 7  # the lowest int divided by -1 does not fit
            yield Case("Div", version, [a, b], **tolerance(dtype))


def pow_(rng: np.random.Generator) -> Cases:
    for version in since("Pow"):
        bases = allowed("Pow", version, "T")
        exponents = allowed("Pow", version, "T1") if version >= 12 else bases
        for dtype in bases:
            for etype in exponents:
                if dtype in FLOATS:
                    a = values(rng, dtype, (2, 4), low=0.0)
                    b = values(rng, etype, (4,), special=False, low=-3, high=3)
                    yield Case("Pow", version, [a, b], **tolerance(dtype, 1e-5))
                    continue
                if etype in FLOATS:
                    continue  # an integer to a fractional power: ONNX Runtime truncates its float result
                a = np.array([-3, -2, -1, 0, 1, 2, 3, 5], dtype)
                b = np.array([3, 2, 5, 4, 0, 6, 4, 3], etype)
                yield Case("Pow", version, [a, b])
                if np.iinfo(etype).min < 0:
                    yield Case("Pow", version, [a[a != 0], np.array([-1, -2, -3, -1, -1, -2, -1], etype)])
        if version >= 12:
            # Past 2**53 a float64 is not exact: 3**39 is 4052555153018976267.
            # ONNX Runtime's CPU kernel computes an integer Pow through std::pow in double and rounds as
            # float64 did (3**39 -> ...256): the exact powers are the expected values here.
            base, exponent = [3, -3, 7, 2, -2, -1, 1, 0], [39, 39, 22, 62, 63, 2**40 + 1, 2**62, 2**40]
            exact = np.array([b**e if abs(b) > 1 else b ** (e % 2 + 2) for b, e in zip(base, exponent)], np.int64)
            yield Case(
                "Pow",
                version,
                [np.array(base, np.int64), np.array(exponent, np.int64)],
                note="exact int64; ONNX Runtime rounds through double",
                expect=[exact],
            )


def mod(rng: np.random.Generator) -> Cases:
    for version in since("Mod"):
        for dtype in allowed("Mod", version, "T"):
            floats = dtype in FLOATS
            for fmod in (0, 1):
                if floats and not fmod and version < 28:
                    continue  # Python's % of floats is new in version 28
                a = values(rng, dtype, (2, 5), special=floats, low=-50, high=50)
                b = values(rng, dtype, (5,), special=floats, low=-9, high=9)
                if not floats:
                    b[b == 0] = 3
                    b[b == -1] = 7
                yield Case("Mod", version, [a, b], {"fmod": fmod}, **tolerance(dtype, 1e-6))
            if floats and dtype != np.float16:
                # Quotients far past 2**24 (2**53 in float64): a - b * trunc(a / b) loses every digit.
                a = np.array([1e20, -1e20, 3.5e15, 7.0, -7.0, 1e10, 5.0], dtype)
                b = np.array([3.0, 3.0, 0.7, np.inf, -np.inf, 1e-3, 0.0], dtype)
                yield Case("Mod", version, [a, b], {"fmod": 1}, **tolerance(dtype), note="large quotients")


UNARY = ("Neg", "Sqrt", "Exp", "Log", "Relu", "Sigmoid", "Tanh", "Identity", "Abs", "Sign", "Ceil", "Floor",
         "Round", "Sin", "Cos", "Tan", "Erf", "Reciprocal", "Not", "IsNaN", "Softplus", "Softsign", "HardSwish")  # fmt: skip
# Functions ONNX Runtime computes with its own approximations (Eigen, MLAS): a few ulps of float32.
LOOSE = {"Exp": 1e-6, "Log": 1e-6, "Sigmoid": 2e-6, "Tanh": 2e-6, "Sin": 2e-6, "Cos": 2e-6, "Tan": 4e-6,
         "Erf": 2e-6, "Softplus": 2e-6, "Elu": 2e-6, "Selu": 2e-6, "Celu": 2e-6}  # fmt: skip


def _in_float64(x: np.ndarray, fn: Callable[[np.ndarray], np.ndarray]) -> list[np.ndarray]:
    with np.errstate(all="ignore"):
        return [fn(x.astype(np.float64)).astype(x.dtype)]


def _gelu(approximate: str) -> Callable[[np.ndarray], np.ndarray]:
    if approximate == "tanh":
        # 0.5 (1 + tanh(u)) as 1 / (1 + exp(-2u)): no cancellation in the negative tail.
        return lambda x: x / (1.0 + np.exp(-2.0 * np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))
    return lambda x: x * 0.5 * np.vectorize(math.erfc)(-x / np.sqrt(2.0))


def _hard_swish(x: np.ndarray) -> np.ndarray:
    return x * np.clip(x / 6.0 + 0.5, 0.0, 1.0)


# Ops whose ONNX Runtime kernel is further from the exact value than a tight tolerance allows, so the
# exact value (float64, rounded once) is expected instead: ONNX Runtime's erf Gelu is 2.8e-5 off in the
# negative tail (float32), its tanh Gelu 1.9e-3 there (1 + tanh cancels) and 3.3e-7 in float64, its
# HardSwish 1.6e-6. cellgraph's are within 1.5e-7 of float64 in float32 and 1e-12 in float64.
EXACT: dict[str, Callable[[np.ndarray, dict[str, Any]], list[np.ndarray]]] = {
    "Gelu": lambda x, a: _in_float64(x, _gelu(a.get("approximate", "none"))),
    "HardSwish": lambda x, a: _in_float64(x, _hard_swish),
}


def unary(op: str, rng: np.random.Generator) -> Cases:
    for version in since(op):
        for param in ("T", "T1"):
            try:
                dtypes = allowed(op, version, param)
                break
            except KeyError:
                continue
        for dtype in dtypes:
            x = values(rng, dtype, (3, 7), special=not (op in ("Neg", "Abs") and dtype not in FLOATS))
            if op == "Round" and dtype in FLOATS:
                x.reshape(-1)[:8] = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999997, 3.5]
            case = Case(op, version, [x], **tolerance(dtype, LOOSE.get(op, 1e-6)))
            if op in EXACT:
                case.expect, case.note = EXACT[op](x, {}), "exact, not ONNX Runtime's approximation"
            yield case


def with_attrs(op: str, attrs: list[dict[str, Any]], rng: np.random.Generator) -> Cases:
    for version in since(op):
        names = set(_schema_attrs(op, version))
        for dtype in allowed(op, version, "T" if op != "IsInf" else "T1"):
            x = values(rng, dtype, (4, 5))
            for a in attrs:
                if set(a) <= names:
                    case = Case(op, version, [x], a, **tolerance(dtype, LOOSE.get(op, 1e-6)))
                    if op in EXACT:
                        case.expect, case.note = EXACT[op](x, a), "exact, not ONNX Runtime's approximation"
                    yield case


def _schema_attrs(op: str, version: int) -> list[str]:
    import onnx

    return list(onnx.defs.get_schema(op, version, "").attributes)


def clip(rng: np.random.Generator) -> Cases:
    for version in since("Clip"):
        if version < 11:
            # min and max are attributes, defaulting to float32's extremes (Clip-6): inf is clipped too.
            for dtype in allowed("Clip", version, "T"):
                x = values(rng, dtype, (3, 4))
                for attrs in ({}, {"min": -1.5}, {"max": 0.25}, {"min": -0.5, "max": 2.0}):
                    yield Case("Clip", version, [x], attrs, **tolerance(dtype))
            continue
        for dtype in allowed("Clip", version, "T"):
            x = values(rng, dtype, (3, 4))
            lo, hi = np.array(3 if dtype.kind == "u" else -2, dtype), np.array(50, dtype)
            for bounds in ([lo, hi], [lo, None], [None, hi], [hi, lo]):  # min > max: every value is max
                case = Case("Clip", version, [x, *bounds], **tolerance(dtype))
                if version == 11 and dtype == np.float16 and None in bounds:
                    # An absent bound is the type's lowest() or max() (the spec; ONNX Runtime's Clip-12 on,
                    # and its float32 Clip-11): its float16 Clip-11 kernel leaves infinities instead.
                    big = np.finfo(np.float16).max
                    low, high = (-big if bounds[0] is None else bounds[0]), (big if bounds[1] is None else bounds[1])
                    case.expect, case.note = [np.minimum(np.maximum(x, low), high)], "ONNX Runtime's keeps inf"
                yield case


def where(rng: np.random.Generator) -> Cases:
    for version in since("Where"):
        for dtype in allowed("Where", version, "T"):
            for sc, sx, sy in (
                ((2, 3), (2, 3), (2, 3)),
                ((2, 1, 3), (3,), (4, 1)),
                ((), (2, 3), (1,)),
                ((0, 3), (3,), ()),
            ):
                c = values(rng, np.dtype(bool), sc)
                yield Case("Where", version, [c, values(rng, dtype, sx), values(rng, dtype, sy)])


def cast(rng: np.random.Generator) -> Cases:
    for version in since("Cast"):
        types = allowed("Cast", version, "T1")
        for src in types:
            for dst in types:
                if src in FLOATS and dst not in FLOATS and dst != np.bool_:
                    # Truncated toward zero; out of range (and NaN) is undefined in ONNX.
                    info = np.iinfo(dst)
                    x = values(rng, src, (12,), special=False, low=max(info.min, -100), high=min(info.max, 100))
                    x[:4] = [2.7, -2.7, 0.5, -0.5] if info.min < 0 else [2.7, 0.9, 0.5, 99.5]
                else:
                    x = values(rng, src, (12,))
                    if src == np.float64 and dst in FLOATS:
                        x[8:] = [1e300, -1e-300, 1.0 + 2.0**-30, 65519.0]
                to = _code(dst)
                yield Case("Cast", version, [x], {"to": to}, **tolerance(dst))


def _code(dtype: np.dtype[Any]) -> int:
    from onnx import helper

    return int(helper.np_dtype_to_tensor_dtype(dtype))


# -------------------------------------------------------------------- reductions
REDUCTIONS = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceLogSumExp", "ReduceL1",
              "ReduceL2", "ReduceSumSquare", "ReduceLogSum")  # fmt: skip
# The version from which ``axes`` is an input, not an attribute.
AXES_INPUT = {"ReduceSum": 13}


def reduce(op: str, rng: np.random.Generator) -> Cases:
    for version in since(op):
        as_input = version >= AXES_INPUT.get(op, 18)
        for dtype in allowed(op, version, "T"):
            # The edges (NaN, inf, the int extremes) for max and min; sums and products of them overflow.
            edges = op in ("ReduceMax", "ReduceMin")
            positive = op == "ReduceLogSum" or dtype == np.uint8
            x = values(rng, dtype, (2, 3, 4), special=edges, low=0 if positive else -3, high=3)
            if dtype == np.bool_:
                x = values(rng, dtype, (2, 3, 4))
            for axes in (None, [-1], [0, 2], [1, -3]):
                for keepdims in (1, 0):
                    yield _reduce_case(op, version, x, axes, keepdims, 0, as_input, dtype)
            if as_input:
                for noop in (0, 1):
                    yield _reduce_case(op, version, x, [], 1, noop, as_input, dtype)
            if op not in ("ReduceMax", "ReduceMin", "ReduceLogSumExp", "ReduceLogSum"):
                yield _reduce_case(op, version, x[:0], [0], 0, 0, as_input, dtype)  # an empty axis


def _reduce_case(op: str, version: int, x: np.ndarray, axes: list[int] | None, keepdims: int, noop: int,
                 as_input: bool, dtype: np.dtype[Any]) -> Case:  # fmt: skip
    attrs: dict[str, Any] = {"keepdims": keepdims}
    inputs: list[Any] = [x]
    if noop:
        attrs["noop_with_empty_axes"] = 1
    if axes is not None:
        if as_input:
            inputs.append(Const(np.array(axes, np.int64)))
        elif axes:
            attrs["axes"] = axes
    case = Case(op, version, inputs, attrs, **tolerance(dtype, 4e-6))
    if op in ("ReduceMax", "ReduceMin") and dtype in FLOATS and np.isnan(x.astype(np.float32)).any():
        # ONNX Runtime's CPU ReduceMax/Min skip a NaN or not by where it stands (std::max); NaN
        # propagates in ONNX's reference (NumPy's max) and in cellgraph.
        reduce = np.max if op == "ReduceMax" else np.min
        axis = None if not axes or noop else tuple(axes)
        want = x if (noop and not axes) else reduce(x, axis=axis, keepdims=bool(keepdims))
        case.expect, case.note = [np.asarray(want, dtype)], "NaN; ONNX Runtime may skip it"
    if op == "ReduceLogSumExp" and noop and not axes and dtype not in FLOATS:
        # Over no axes it is log(exp(x)) = x. ONNX Runtime's uint32 kernel truncates exp(x) to an
        # integer first (log(7) for x = 2 gives 1); ONNX's reference gives x.
        case.expect, case.note = [x], "log(exp(x)); ONNX Runtime truncates exp(x) for uint32"
    if op == "ReduceMean" and dtype in FLOATS and x.size == 0:
        # The mean of nothing is 0 / 0: NaN, as NumPy's (ONNX's reference); ONNX Runtime's CPU kernel gives 0.
        case.expect = [np.full(np.mean(x.astype(np.float32), axis=tuple(axes or ()), keepdims=bool(keepdims)).shape,
                               np.nan, dtype)]  # fmt: skip
        case.note = "the mean of nothing; ONNX Runtime gives 0"
    return case


def arg(op: str, rng: np.random.Generator) -> Cases:
    for version in since(op):
        last = version >= 12
        for dtype in allowed(op, version, "T"):
            x = values(rng, dtype, (3, 4, 5), special=False, low=-2, high=2, ties=True)
            for axis in (0, -1, 1, -3) if version >= 11 else (0, 1):
                for keepdims in (1, 0):
                    for select_last in (0, 1) if last else (0,):
                        attrs = {"axis": axis, "keepdims": keepdims}
                        if select_last:
                            attrs["select_last_index"] = 1
                        yield Case(op, version, [x], attrs)
            if dtype in FLOATS:
                # ONNX Runtime's CPU ArgMax/ArgMin compare past a NaN; NumPy's (ONNX's reference) and
                # cellgraph's pick the first NaN, as the largest and the smallest alike.
                nan = values(rng, dtype, (3, 4))
                pick = np.argmax if op == "ArgMax" else np.argmin
                want = np.expand_dims(pick(nan.astype(np.float32), axis=1), 1).astype(np.int64)
                yield Case(op, version, [nan], {"axis": 1}, note="NaN; ONNX Runtime skips it", expect=[want])


def softmax(op: str, rng: np.random.Generator) -> Cases:
    for version in since(op):
        for dtype in allowed(op, version, "T"):
            x = values(rng, dtype, (2, 3, 4), special=False)
            tol = tolerance(dtype, 4e-6)
            # Before version 13: the input flattened to 2-D at the axis (default 1; negative from 11).
            axes: tuple[int | None, ...] = (-1, 0, 1, -2) if version >= 13 else (None, 0, 1, 2)
            for axis in axes + ((-2,) if version == 11 else ()):
                case = Case(op, version, [x], {} if axis is None else {"axis": axis}, **tol)
                if op == "LogSoftmax":
                    # ONNX Runtime's log-softmax of float32 near 0 is off by 5e-8 absolute (2e-5 relative):
                    # the exact value (float64) is expected; cellgraph's is within 3e-7 of it.
                    exact = _log_softmax if version >= 13 else _coerced_log_softmax
                    at = 1 if axis is None else axis
                    case.expect, case.note = _in_float64(x, lambda v, a=at, f=exact: f(v, a)), "exact"
                yield case
            rows = values(rng, dtype, (3, 4), special=False)
            rows[0, 1] = -np.inf
            rows[1, :] = -np.inf if op != "Hardmax" else 1.0  # a row of -inf: NaN in ONNX Runtime
            rows[2, 3] = np.inf if op == "Hardmax" else rows[2, 3]
            yield Case(op, version, [rows], {"axis": -1}, **tol, note="-inf")
            if op == "Hardmax":  # ties: the first of the largest is 1
                yield Case(op, version, [values(rng, dtype, (4, 5), False, -1, 1, ties=True)], {"axis": 0}, note="ties")


def _log_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    shifted = x - np.max(x, axis=axis, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


def _coerced_log_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    """LogSoftmax before version 13: over the input flattened to 2-D at ``axis``."""
    axis %= x.ndim
    flat = x.reshape(int(np.prod(x.shape[:axis])), -1)
    return _log_softmax(flat, -1).reshape(x.shape)


# ------------------------------------------------------------------ the table
# Each family by name (an op's, or the ops' it sweeps together), with the generator of its cases.
FAMILIES: dict[str, Callable[[np.random.Generator], Cases]] = {
    **{op: (lambda rng, op=op: binary(op, rng)) for op in ("Add", "Sub", "Mul", "Max", "Min", "Sum", "Mean", "Equal",
       "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Xor")},
    "Div": div, "Pow": pow_, "Mod": mod, "Clip": clip, "Where": where, "Cast": cast,
    **{op: (lambda rng, op=op: unary(op, rng)) for op in UNARY},
    "IsInf": lambda rng: with_attrs("IsInf", [{}, {"detect_negative": 0}, {"detect_positive": 0}], rng),
    "LeakyRelu": lambda rng: with_attrs("LeakyRelu", [{}, {"alpha": -0.5}], rng),
    "Elu": lambda rng: with_attrs("Elu", [{}, {"alpha": 0.3}], rng),
    "Selu": lambda rng: with_attrs("Selu", [{}, {"alpha": 2.0, "gamma": 0.5}], rng),
    "Celu": lambda rng: with_attrs("Celu", [{}, {"alpha": 0.3}], rng),
    "HardSigmoid": lambda rng: with_attrs("HardSigmoid", [{}, {"alpha": -0.3, "beta": 0.1}], rng),
    "Gelu": lambda rng: with_attrs("Gelu", [{}, {"approximate": "tanh"}], rng),
    **{op: (lambda rng, op=op: reduce(op, rng)) for op in REDUCTIONS},
    "ArgMax": lambda rng: arg("ArgMax", rng), "ArgMin": lambda rng: arg("ArgMin", rng),
    "Softmax": lambda rng: softmax("Softmax", rng), "LogSoftmax": lambda rng: softmax("LogSoftmax", rng),
    "Hardmax": lambda rng: softmax("Hardmax", rng),
    **ARRAY_FAMILIES,
    **NN_FAMILIES,
    **WINDOW_FAMILIES,
    **MODEL_FAMILIES,
}  # fmt: skip


def all_cases(families: list[str] | None = None, seed: int = 0) -> list[Case]:
    """Every case of ``families`` (all of them when None), from one seeded generator each."""
    out: list[Case] = []
    for i, (name, family) in enumerate(FAMILIES.items()):
        if families is None or name in families:
            out.extend(family(np.random.default_rng([seed, i])))
    return out
