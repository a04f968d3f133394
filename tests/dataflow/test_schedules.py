"""Learning-rate schedules in a local session: the rate each update applies, against NumPy formulas."""

from __future__ import annotations

import numpy as np
import pytest

import cellgraph as cg
from cellgraph.dataflow.schedules import schedule_from_fields

GRAD = np.array([1.0, -2.0, 0.5])


def _applied_rates(optimizer: cg.optim.Optimizer, steps: int, dtype: str = "float64") -> np.ndarray:
    """The learning rate of each of ``steps`` updates, read off ``w``: loss ``sum(w * GRAD)`` has gradient GRAD."""
    g = cg.Graph()
    with g.as_default():
        w = cg.variable(np.zeros(3), dtype=dtype, name="w")
        step = cg.variable(0, dtype="int64", name="global_step", trainable=False)
        train = optimizer.minimize(cg.reduce_sum(w * cg.constant(GRAD, dtype)), global_step=step)
    sess = cg.Session(g)
    values = [sess.run(w)]
    for _ in range(steps):
        sess.run(train)
        values.append(sess.run(w))
    assert sess.run(step) == steps
    moves = np.diff(np.array(values, np.float64), axis=0)  # -lr * GRAD per step
    return -moves[:, 0] / GRAD[0]


def test_cosine_decay_with_warmup_at_start_warmup_end_middle_and_end() -> None:
    peak, warmup, decay, alpha = 0.2, 4, 10, 0.05
    rates = _applied_rates(cg.optim.SGD(cg.optim.cosine_decay(peak, decay, warmup_steps=warmup, alpha=alpha)), 18)
    s = np.arange(18.0)
    t = np.clip(s - warmup, 0, decay) / decay
    want = np.where(s < warmup, peak * s / warmup, peak * ((1 - alpha) * 0.5 * (1 + np.cos(np.pi * t)) + alpha))
    np.testing.assert_allclose(rates, want, rtol=1e-12, atol=1e-15)
    assert rates[0] == 0.0  # step 0: the warm-up starts from nothing
    assert rates[warmup] == pytest.approx(peak, rel=1e-12)  # warm-up end: the peak
    assert rates[warmup + decay // 2] == pytest.approx(peak * (0.5 * (1 - alpha) + alpha), rel=1e-12)  # middle
    assert rates[-1] == pytest.approx(alpha * peak, rel=1e-12)  # past the end: alpha * peak, held


@pytest.mark.parametrize("staircase", [False, True])
def test_exponential_decay(staircase: bool) -> None:
    rates = _applied_rates(cg.optim.SGD(cg.optim.exponential_decay(0.5, 3, 0.8, staircase=staircase)), 10)
    s = np.arange(10.0)
    want = 0.5 * 0.8 ** (np.floor(s / 3) if staircase else s / 3)
    np.testing.assert_allclose(rates, want, rtol=1e-12)


def test_piecewise_constant_switches_after_each_boundary() -> None:
    rates = _applied_rates(cg.optim.SGD(cg.optim.piecewise_constant([2, 5], [0.3, 0.2, 0.1])), 8)
    np.testing.assert_allclose(rates, [0.3, 0.3, 0.3, 0.2, 0.2, 0.2, 0.1, 0.1], rtol=1e-12)


def test_a_schedule_drives_adam_and_a_float32_variable() -> None:
    """Adam's first step moves each element by about the rate (m / sqrt(v) is +-1): the warm-up's rate."""
    schedule = cg.optim.cosine_decay(0.1, 8, warmup_steps=4)
    g = cg.Graph()
    with g.as_default():
        w = cg.variable(np.zeros(3, np.float32), name="w")
        step = cg.variable(1, dtype="int32", name="global_step", trainable=False)
        train = cg.optim.Adam(schedule).minimize(cg.reduce_sum(w * cg.constant(GRAD, "float32")), global_step=step)
    sess = cg.Session(g)
    sess.run(train)
    np.testing.assert_allclose(sess.run(w), -np.sign(GRAD) * schedule.value(1), rtol=1e-4)


def test_the_schedule_survives_a_graphdef_round_trip() -> None:
    g = cg.Graph()
    with g.as_default():
        w = cg.variable(np.zeros(3), dtype="float64", name="w")
        step = cg.variable(6, dtype="int32", name="global_step", trainable=False)
        cg.optim.SGD(cg.optim.exponential_decay(1.0, 2, 0.5, staircase=True)).minimize(
            cg.reduce_sum(w * cg.constant(GRAD, "float64")), global_step=step
        )
    g2 = cg.from_graphdef(cg.to_graphdef(g))
    sess = cg.Session(g2)
    sess.run(g2.node("SGD/update"))
    np.testing.assert_allclose(sess.run(g2.node("w").output(0)), -0.125 * GRAD, rtol=1e-12)


def test_a_schedule_without_a_global_step_is_refused_before_anything_is_built() -> None:
    g = cg.Graph()
    with g.as_default():
        w = cg.variable([1.0], name="w")
        loss = cg.reduce_sum(w * w)
        before = list(g.nodes)
        with pytest.raises(
            cg.GraphError, match="SGD: learning rate CosineDecay.* is a schedule of the global step; pass global_step="
        ):
            cg.optim.SGD(cg.optim.cosine_decay(0.1, 10)).minimize(loss)
        assert list(g.nodes) == before


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: cg.optim.cosine_decay(float("nan"), 10), "cosine_decay: initial_learning_rate must be a finite number, got nan"),
        (lambda: cg.optim.cosine_decay(-0.1, 10), "cosine_decay: initial_learning_rate must be 0 or more, got -0.1"),
        (lambda: cg.optim.cosine_decay(0.1, 0), "cosine_decay: decay_steps must be an int, 1 or more, got 0"),
        (lambda: cg.optim.cosine_decay(0.1, 10, warmup_steps=-1), "cosine_decay: warmup_steps must be an int, 0 or more, got -1"),
        (lambda: cg.optim.cosine_decay(0.1, 10, alpha=1.5), r"cosine_decay: alpha must be in \[0, 1\], got 1.5"),
        (lambda: cg.optim.exponential_decay(0.1, 10, float("inf")), "exponential_decay: decay_rate must be a finite number, got inf"),
        (lambda: cg.optim.exponential_decay(0.1, 2.5, 0.5), "exponential_decay: decay_steps must be an int, 1 or more, got 2.5"),
        (lambda: cg.optim.exponential_decay(0.1, 10, 0.5, staircase=1), "exponential_decay: staircase must be True or False, got 1"),
        (lambda: cg.optim.piecewise_constant([5, 5], [1.0, 0.5, 0.1]), r"piecewise_constant: boundaries must rise strictly, got \[5, 5\]"),
        (lambda: cg.optim.piecewise_constant([5], [1.0]), "piecewise_constant: values must have one entry more than boundaries, got 1 values for 1 boundaries"),
        (lambda: cg.optim.piecewise_constant([5], [1.0, -0.5]), r"piecewise_constant: values\[1\] must be 0 or more, got -0.5"),
        (lambda: cg.optim.piecewise_constant([-5], [1.0, 0.5]), r"piecewise_constant: boundaries\[0\] must be an int, 0 or more, got -5"),
        (lambda: schedule_from_fields("linear", {}), "learning-rate schedule 'linear' is not one of piecewise_constant, exponential_decay, cosine_decay"),
    ],
)  # fmt: skip
def test_bad_schedule_fields_are_named(make, message: str) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match=f"^{message}$"):
        make()


def test_the_op_refuses_a_float_step() -> None:
    from cellgraph.dataflow.ops.schedule import learning_rate_schedule

    g = cg.Graph()
    with g.as_default():
        with pytest.raises(cg.DTypeError, match="the step must be an int32 or int64 scalar, got float32"):
            learning_rate_schedule(cg.optim.cosine_decay(0.1, 10), cg.constant(1.0))
        with pytest.raises(cg.ShapeError, match=r"the step must be a scalar, got shape \(2,\)"):
            learning_rate_schedule(cg.optim.cosine_decay(0.1, 10), cg.constant([1, 2]))
        with pytest.raises(TypeError, match="learning_rate_schedule: schedule must be a cg.optim schedule, got 0.1"):
            learning_rate_schedule(0.1, cg.constant(1))  # type: ignore[arg-type]
