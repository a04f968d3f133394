"""The cases of the ONNX import sweep for the ops real exported models use that the tenth session mapped: PRelu,
Mish, ThresholdedRelu, Shrink, InstanceNormalization, GroupNormalization, LpNormalization,
MeanVarianceNormalization, GatherElements, Einsum, CastLike and the two losses; each version and dtype ONNX
Runtime runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .onnx_sweep import FLOATS, Case, Cases, Const, allowed, since, tolerance, values

# Means and square roots of sums of values up to 4: ONNX Runtime's order of summation differs from cellgraph's by
# float32 noise, which is absolute where a result is near 0.
NORM_TOL = 1e-5


def norm_tolerance(dtype: np.dtype[Any]) -> dict[str, float]:
    if dtype == np.float64:
        # ONNX Runtime computes GroupNormalization's statistics in float32 (stash_type 1), cellgraph in float64.
        return {"rtol": 1e-6, "atol": 1e-6}
    tol = tolerance(dtype, NORM_TOL)
    return {**tol, "atol": max(tol["atol"], 1e-6)} if dtype == np.float32 else tol


def prelu(rng: np.random.Generator) -> Cases:
    for version in since("PRelu"):
        for dtype in allowed("PRelu", version):
            x = values(rng, dtype, (2, 3, 4))
            for shape in ((3, 1), (4,), (1,), (2, 3, 4)):
                slope = values(rng, dtype, shape, special=False)
                yield Case("PRelu", version, [x, slope], **tolerance(dtype))
                yield Case("PRelu", version, [x, Const(slope)], **tolerance(dtype))


def activation(op: str, attrs: list[dict[str, Any]]) -> Callable[[np.random.Generator], Cases]:
    def cases(rng: np.random.Generator) -> Cases:
        for version in since(op):
            for dtype in allowed(op, version):
                x = values(rng, dtype, (4, 5))
                for a in attrs:
                    case = Case(op, version, [x], a, **tolerance(dtype, 2e-6))
                    if op == "Shrink" and dtype == np.float64:
                        # ONNX Runtime's double Shrink rounds to float32; the exact value, rounded once, instead.
                        # The attributes are float32s, as ONNX stores them.
                        lambd, bias = (float(np.float32(a.get(k, d))) for k, d in (("lambd", 0.5), ("bias", 0.0)))
                        exact = np.where(x > lambd, x - bias, np.where(x < -lambd, x + bias, 0.0))
                        case.expect, case.note = [exact], "exact: ONNX Runtime's double Shrink is float32"
                    yield case

    return cases


def instance_norm(rng: np.random.Generator) -> Cases:
    for version in since("InstanceNormalization"):
        for dtype in allowed("InstanceNormalization", version):
            x = values(rng, dtype, (2, 3, 4, 5), special=False)
            scale, bias = values(rng, dtype, (3,), special=False), values(rng, dtype, (3,), special=False)
            for attrs in ({}, {"epsilon": 0.1}):
                yield Case("InstanceNormalization", version, [x, Const(scale), Const(bias)], attrs,
                           **norm_tolerance(dtype))  # fmt: skip
            yield Case("InstanceNormalization", version, [x[:, :, 0], scale, bias], **norm_tolerance(dtype))


def group_norm(rng: np.random.Generator) -> Cases:
    for version in since("GroupNormalization"):
        for dtype in allowed("GroupNormalization", version):
            x = values(rng, dtype, (2, 6, 3, 4), special=False)
            for groups in (1, 3, 6):
                per = groups if version < 21 else 6
                scale, bias = values(rng, dtype, (per,), special=False), values(rng, dtype, (per,), special=False)
                yield Case("GroupNormalization", version, [x, Const(scale), Const(bias)], {"num_groups": groups},
                           **norm_tolerance(dtype))  # fmt: skip


def lp_norm(rng: np.random.Generator) -> Cases:
    for version in since("LpNormalization"):
        for dtype in allowed("LpNormalization", version):
            x = values(rng, dtype, (3, 4), special=False)
            x[1] = 0  # a zero norm: zeros out
            for attrs in ({}, {"p": 1}, {"axis": 0}, {"axis": 0, "p": 1}):
                yield Case("LpNormalization", version, [x], attrs, **norm_tolerance(dtype))


def mean_variance_norm(rng: np.random.Generator) -> Cases:
    for version in since("MeanVarianceNormalization"):
        for dtype in allowed("MeanVarianceNormalization", version):
            x = values(rng, dtype, (2, 3, 4, 5), special=False)
            # ONNX's formula, sqrt(E[x^2] - E[x]^2), cancels in float32 (over 3 values, for axes [1]): a different
            # order of summation moves the result by up to about 2e-5 of it.
            tol = {"rtol": 5e-5, "atol": 1e-6} if dtype == np.float32 else norm_tolerance(dtype)
            for attrs in ({}, {"axes": [1]}, {"axes": [2, 3]}):
                yield Case("MeanVarianceNormalization", version, [x], attrs, **tol)


def gather_elements(rng: np.random.Generator) -> Cases:
    for version in since("GatherElements"):
        for dtype in allowed("GatherElements", version):
            data = values(rng, dtype, (3, 4, 2))
            for axis in (0, 1, 2, -1):
                size = data.shape[axis]
                index = rng.integers(-size, size, (2, 3, 2)).astype(np.int64)
                yield Case("GatherElements", version, [data, index], {"axis": axis})
                yield Case("GatherElements", version, [data, Const(index.astype(np.int32))], {"axis": axis})


EQUATIONS = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]),
    ("ij->ji", [(3, 4)]),
    ("i,i->", [(5,), (5,)]),
    ("bhqd,bhkd->bhqk", [(2, 2, 3, 4), (2, 2, 5, 4)]),
    ("ij,jk", [(3, 4), (4, 5)]),
    ("...j->...", [(2, 3, 4)]),
]


def einsum(rng: np.random.Generator) -> Cases:
    for version in since("Einsum"):
        for dtype in allowed("Einsum", version):
            for equation, shapes in EQUATIONS:
                operands = [values(rng, dtype, shape, special=False, low=-2.0, high=2.0) for shape in shapes]
                tol = tolerance(dtype, 1e-5) if dtype in FLOATS else {}
                yield Case("Einsum", version, operands, {"equation": equation}, **tol)


def cast_like(rng: np.random.Generator) -> Cases:
    for version in since("CastLike"):
        types = [t for t in allowed("CastLike", version, "T1") if t in FLOATS or t.kind in "iub"]
        for src in types:
            for dst in types:
                if src in FLOATS and dst not in FLOATS:
                    continue  # float to integer: truncated, out of range undefined (the Cast family sweeps it)
                x = values(rng, src, (12,), special=dst in FLOATS)
                yield Case("CastLike", version, [x, Const(np.zeros(1, dst))], **tolerance(dst))


def loss(op: str) -> Callable[[np.random.Generator], Cases]:
    def cases(rng: np.random.Generator) -> Cases:
        for version in since(op):
            for dtype in allowed(op, version):
                for shape in ((4, 5), (2, 5, 3)):
                    scores = values(rng, dtype, shape, special=False)
                    if op == "NegativeLogLikelihoodLoss":
                        scores = -np.abs(scores)  # log-probabilities
                    target = rng.integers(0, 5, (shape[0], *shape[2:])).astype(np.int64)
                    weight = values(rng, dtype, (5,), special=False, low=0.1, high=2.0)
                    for reduction, ignore in (("none", None), ("sum", None), ("mean", None), ("mean", 2), ("sum", 0)):
                        attrs: dict[str, Any] = {"reduction": reduction}
                        if ignore is not None:
                            attrs["ignore_index"] = ignore
                        tol = (
                            {**tolerance(dtype, 1e-5), "atol": 1e-6} if dtype == np.float32 else tolerance(dtype, 1e-5)
                        )
                        yield Case(op, version, [scores, target], attrs, **tol)
                        yield Case(op, version, [scores, target, Const(weight)], attrs, **tol)

    return cases


MODEL_FAMILIES: dict[str, Callable[[np.random.Generator], Cases]] = {
    "NegativeLogLikelihoodLoss": loss("NegativeLogLikelihoodLoss"),
    "SoftmaxCrossEntropyLoss": loss("SoftmaxCrossEntropyLoss"),
    "PRelu": prelu,
    "Mish": activation("Mish", [{}]),
    "ThresholdedRelu": activation("ThresholdedRelu", [{}, {"alpha": 0.5}, {"alpha": -1.0}]),
    "Shrink": activation("Shrink", [{}, {"bias": 0.3, "lambd": 1.0}]),
    "InstanceNormalization": instance_norm,
    "GroupNormalization": group_norm,
    "LpNormalization": lp_norm,
    "MeanVarianceNormalization": mean_variance_norm,
    "GatherElements": gather_elements,
    "Einsum": einsum,
    "CastLike": cast_like,
}
