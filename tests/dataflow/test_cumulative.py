"""``cg.cumsum`` and ``cg.cumprod``: their refusals' words, and the product's
gradient at zeros (where a rule that divides by ``x`` gives NaN)."""

from __future__ import annotations

import numpy as np
import pytest

import cellgraph as cg
from cellgraph.dataflow.ops.base import apply


def test_cumprod_gradient_is_exact_at_zeros() -> None:
    data = np.array([2.0, 0.0, 3.0, 0.0, 5.0])
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((5,), "float64", name="x")
        (dx,) = cg.gradients(cg.reduce_sum(cg.cumprod(x)), [x])
    got = cg.Session(g).run(dx, {x: data})
    # y = [2, 0, 0, 0, 0]: d/dx0 = 1, d/dx1 = 2 + 2*3 = 8 (y2 = x0 x1 x2), d/dx2..4 = 0.
    np.testing.assert_allclose(got, [1.0, 8.0, 0.0, 0.0, 0.0])


@pytest.mark.parametrize("fn", [cg.cumsum, cg.cumprod])
def test_scan_refusals_name_the_op_and_what_is_wrong(fn) -> None:  # noqa: ANN001
    name = fn.__name__
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((2, 3), name="x")
        before = len(g.nodes)
        with pytest.raises(cg.ShapeError, match=rf"{name}: axis 2 is out of range for shape \(2, 3\) \(rank 2\)"):
            fn(x, axis=2)
        with pytest.raises(cg.ShapeError, match=rf"{name}: axis must be an int, got 0.5"):
            fn(x, axis=0.5)
        with pytest.raises(cg.ShapeError, match=rf"{name}: axis 0 is out of range for shape \(\) \(rank 0\)"):
            fn(cg.constant(np.float32(1.0)))
        flags = cg.placeholder((2, 3), "bool", name="flags")
        kind = "Cumsum" if name == "cumsum" else "Cumprod"
        with pytest.raises(cg.DTypeError, match=rf"{kind} '{name}' .*expects a float or int tensor, got bool"):
            fn(flags)
        assert len(g.nodes) == before + 2  # only the test's own constant and bool placeholder


def test_cumprod_grad_refuses_a_gradient_that_does_not_fit() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((2, 3), "float64", name="x")
        attrs = {"axis": 1, "exclusive": False, "reverse": False}
        with pytest.raises(cg.ShapeError, match=r"gradient shape \(2, 4\) is not the input's \(2, 3\)"):
            apply("CumprodGrad", [x, cg.placeholder((2, 4), "float64", name="dy")], attrs)
        with pytest.raises(cg.DTypeError, match="gradient dtype float32 is not the input's float64"):
            apply("CumprodGrad", [x, cg.placeholder((2, 3), name="dy32")], attrs)
