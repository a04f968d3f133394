"""Optimizers follow the same trajectory as PyTorch's on the same problem."""

from __future__ import annotations

import numpy as np
import pytest

import cellgraph as cg

torch = pytest.importorskip("torch", reason="compares against PyTorch: pip install torch==2.13.0")

X = np.random.default_rng(0).normal(size=(16, 5))
Y = np.random.default_rng(1).normal(size=(16, 3))
W0 = np.random.default_rng(2).normal(size=(5, 3))


def _cellgraph_trajectory(optimizer: cg.optim.Optimizer, steps: int) -> np.ndarray:
    g = cg.Graph()
    with g.as_default():
        w = cg.variable(W0, dtype="float64", name="w")
        loss = cg.reduce_mean(cg.square(cg.constant(X, "float64") @ w - cg.constant(Y, "float64")))
        train = optimizer.minimize(loss)
    sess = cg.Session(g)
    for _ in range(steps):
        sess.run(train)
    return sess.run(w)


def _torch_trajectory(make, steps: int) -> np.ndarray:  # noqa: ANN001
    w = torch.tensor(W0, requires_grad=True)
    opt = make([w])
    x, y = torch.tensor(X), torch.tensor(Y)
    for _ in range(steps):
        opt.zero_grad()
        ((x @ w - y) ** 2).mean().backward()
        opt.step()
    return w.detach().numpy()


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (lambda: cg.optim.SGD(0.1), lambda p: torch.optim.SGD(p, lr=0.1)),
        (lambda: cg.optim.Momentum(0.05, 0.9), lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)),
        (
            lambda: cg.optim.Momentum(0.05, 0.9, nesterov=True),
            lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True),
        ),
        (lambda: cg.optim.Adam(0.01), lambda p: torch.optim.Adam(p, lr=0.01, eps=1e-8)),
        (
            lambda: cg.optim.AdamW(0.01, weight_decay=0.1),
            lambda p: torch.optim.AdamW(p, lr=0.01, eps=1e-8, weight_decay=0.1),
        ),
        (lambda: cg.optim.RMSProp(0.01), lambda p: torch.optim.RMSprop(p, lr=0.01, alpha=0.9, eps=1e-10)),
        (
            lambda: cg.optim.RMSProp(0.01, decay=0.8, momentum=0.5),
            lambda p: torch.optim.RMSprop(p, lr=0.01, alpha=0.8, eps=1e-10, momentum=0.5),
        ),
        (
            lambda: cg.optim.Adagrad(0.1, initial_accumulator_value=0.5, epsilon=1e-6),
            lambda p: torch.optim.Adagrad(p, lr=0.1, initial_accumulator_value=0.5, eps=1e-6),
        ),
    ],
    ids=["sgd", "momentum", "nesterov", "adam", "adamw", "rmsprop", "rmsprop-momentum", "adagrad"],
)
def test_matches_pytorch_over_ten_steps(ours, theirs) -> None:  # noqa: ANN001
    # Adam adds epsilon after bias correction here (TensorFlow's "epsilon hat"
    # form) and before it in PyTorch: the two differ by O(epsilon) per step.
    # RMSProp adds epsilon inside the square root (TensorFlow) and PyTorch
    # outside it: with epsilon 1e-10 against mean squares near 1 they agree to
    # about 1e-10.
    rtol = 1e-5 if isinstance(ours(), (cg.optim.Adam, cg.optim.AdamW)) else 1e-6
    np.testing.assert_allclose(_cellgraph_trajectory(ours(), 10), _torch_trajectory(theirs, 10), rtol=rtol, atol=1e-9)


def test_bad_hyperparameters_are_rejected() -> None:
    with pytest.raises(ValueError, match=r"SGD: learning_rate must be positive, got 0"):
        cg.optim.SGD(0)
    with pytest.raises(ValueError, match=r"Momentum: momentum must be in \[0, 1\), got 1.5"):
        cg.optim.Momentum(0.1, 1.5)
    with pytest.raises(ValueError, match=r"Adam: beta2 must be in \[0, 1\), got 1.0"):
        cg.optim.Adam(0.1, beta2=1.0)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: cg.optim.SGD(float("nan")), "SGD: learning_rate must be positive, got nan"),
        (lambda: cg.optim.Adam(float("inf")), "Adam: learning_rate must be a finite number, 0 or more, got inf"),
        (lambda: cg.optim.Momentum(0.1, -0.5), "Momentum: momentum must be a finite number, 0 or more, got -0.5"),
        (lambda: cg.optim.Momentum(0.1, nesterov="yes"), "Momentum: nesterov must be True or False, got 'yes'"),  # type: ignore[arg-type]
        (lambda: cg.optim.RMSProp(0.1, decay=1.0), r"RMSProp: decay must be in \[0, 1\), got 1.0"),
        (lambda: cg.optim.RMSProp(0.1, decay=float("nan")), r"RMSProp: decay must be in \[0, 1\), got nan"),
        (lambda: cg.optim.RMSProp(0.1, momentum=-0.1), "RMSProp: momentum must be a finite number, 0 or more, got -0.1"),
        (lambda: cg.optim.RMSProp(0.1, momentum=1.0), r"RMSProp: momentum must be in \[0, 1\), got 1.0"),
        (lambda: cg.optim.RMSProp(0.1, epsilon=-1e-10), "RMSProp: epsilon must be a finite number, 0 or more, got -1e-10"),
        (
            lambda: cg.optim.Adagrad(0.1, initial_accumulator_value=-0.1),
            "Adagrad: initial_accumulator_value must be a finite number, 0 or more, got -0.1",
        ),
        (lambda: cg.optim.Adagrad(0.1, epsilon=float("inf")), "Adagrad: epsilon must be a finite number, 0 or more, got inf"),
        (lambda: cg.optim.AdamW(0.1, weight_decay=float("nan")), "AdamW: weight_decay must be a finite number, 0 or more, got nan"),
        (lambda: cg.optim.AdamW(0.1, weight_decay=-0.01), "AdamW: weight_decay must be a finite number, 0 or more, got -0.01"),
        (lambda: cg.optim.AdamW(0.1, beta1=1.5), r"AdamW: beta1 must be in \[0, 1\), got 1.5"),
        (lambda: cg.optim.Adam(0.1, amsgrad=1), "Adam: amsgrad must be True or False, got 1"),  # type: ignore[arg-type]
        (lambda: cg.optim.AdamW(0.1, amsgrad="no"), "AdamW: amsgrad must be True or False, got 'no'"),  # type: ignore[arg-type]
        (lambda: cg.optim.RMSProp(0.1, centered=None), "RMSProp: centered must be True or False, got None"),  # type: ignore[arg-type]
        (lambda: cg.optim.Adamax(-0.1), "Adamax: learning_rate must be positive, got -0.1"),
        (lambda: cg.optim.Adamax(0.1, beta1=-0.1), r"Adamax: beta1 must be in \[0, 1\), got -0.1"),
        (lambda: cg.optim.Adamax(0.1, beta2=1.0), r"Adamax: beta2 must be in \[0, 1\), got 1.0"),
        (lambda: cg.optim.Adamax(0.1, epsilon=-1e-8), "Adamax: epsilon must be a finite number, 0 or more, got -1e-08"),
        (lambda: cg.optim.Nadam(0), "Nadam: learning_rate must be positive, got 0"),
        (lambda: cg.optim.Nadam(0.1, beta1=1.0), r"Nadam: beta1 must be in \[0, 1\), got 1.0"),
        (lambda: cg.optim.Nadam(0.1, beta2=float("nan")), r"Nadam: beta2 must be in \[0, 1\), got nan"),
        (lambda: cg.optim.Nadam(0.1, momentum_decay=-4e-3), "Nadam: momentum_decay must be a finite number, 0 or more, got -0.004"),
        (lambda: cg.optim.Nadam(0.1, epsilon=float("inf")), "Nadam: epsilon must be a finite number, 0 or more, got inf"),
        (lambda: cg.optim.Adadelta(-1.0), "Adadelta: learning_rate must be positive, got -1.0"),
        (lambda: cg.optim.Adadelta(1.0, rho=1.5), r"Adadelta: rho must be in \[0, 1\], got 1.5"),
        (lambda: cg.optim.Adadelta(1.0, rho=-0.1), r"Adadelta: rho must be in \[0, 1\], got -0.1"),
        (lambda: cg.optim.Adadelta(1.0, rho=float("nan")), r"Adadelta: rho must be in \[0, 1\], got nan"),
        (lambda: cg.optim.Adadelta(1.0, epsilon=-1e-6), "Adadelta: epsilon must be a finite number, 0 or more, got -1e-06"),
    ],
)  # fmt: skip
def test_every_hyperparameter_rule_names_the_hyperparameter(make, message: str) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match=f"^{message}$"):
        make()


@pytest.mark.parametrize(
    ("optimizer", "slots"),
    [
        (cg.optim.RMSProp(0.1), {"RMSProp/w/ms", "RMSProp/w/mom"}),
        (cg.optim.Adagrad(0.1), {"Adagrad/w/accumulator"}),
        (cg.optim.AdamW(0.1), {"AdamW/w/m", "AdamW/w/v", "AdamW/w/t"}),
        (cg.optim.Adam(0.1, amsgrad=True), {"Adam/w/m", "Adam/w/v", "Adam/w/t", "Adam/w/vhat"}),
        (cg.optim.AdamW(0.1, amsgrad=True), {"AdamW/w/m", "AdamW/w/v", "AdamW/w/t", "AdamW/w/vhat"}),
        (cg.optim.RMSProp(0.1, centered=True), {"RMSProp/w/ms", "RMSProp/w/mg", "RMSProp/w/mom"}),
        (cg.optim.Adamax(0.1), {"Adamax/w/m", "Adamax/w/u", "Adamax/w/t"}),
        (cg.optim.Nadam(0.1), {"Nadam/w/m", "Nadam/w/v", "Nadam/w/t", "Nadam/w/mu_product"}),
        (cg.optim.Adadelta(1.0), {"Adadelta/w/accum", "Adadelta/w/accum_update"}),
    ],
    ids=["rmsprop", "adagrad", "adamw", "amsgrad", "adamw-amsgrad", "centered", "adamax", "nadam", "adadelta"],
)
def test_new_optimizers_keep_the_registry_slots(optimizer: cg.optim.Optimizer, slots: set[str]) -> None:
    g = cg.Graph()
    with g.as_default():
        w = cg.variable([1.0, -2.0], name="w")
        train = optimizer.minimize(cg.reduce_sum(w * w))
    assert {n.name for n in g.variables()} - {"w"} == slots
    sess = cg.Session(g)
    sess.run(train)
    assert (sess.run(w) != [1.0, -2.0]).all()


def test_adagrad_accumulator_holds_the_sum_of_squared_gradients() -> None:
    """The slot starts at zero (on a server too); the initial value is added where it is read."""
    g = cg.Graph()
    with g.as_default():
        w = cg.variable([1.0, -2.0], dtype="float64", name="w")
        train = cg.optim.Adagrad(0.5, initial_accumulator_value=0.25, epsilon=0.0).minimize(cg.reduce_sum(w * w))
    sess = cg.Session(g)
    sess.run(train)
    grad = np.array([2.0, -4.0])
    np.testing.assert_allclose(sess.run(g.tensor("Adagrad/w/accumulator:0")), grad**2)
    np.testing.assert_allclose(sess.run(w), [1.0, -2.0] - 0.5 * grad / np.sqrt(grad**2 + 0.25))


def test_the_registry_refuses_a_second_kind_of_one_name() -> None:
    from cellgraph.dataflow.optimizer_registry import OPTIMIZER_KINDS, register_optimizer

    with pytest.raises(
        cg.RegistryError, match=r"optimizer 'adam' is already registered \(at .*optimizer_registry.py:\d+\)"
    ):
        register_optimizer(OPTIMIZER_KINDS.lookup("adam"))
    with pytest.raises(
        cg.RegistryError,
        match=r"no optimizer named 'lamb'; known: adadelta, adagrad, adam, adamax, adamw, momentum, nadam, rmsprop, sgd",
    ):
        OPTIMIZER_KINDS.lookup("lamb")


def test_a_flag_that_adds_a_slot_shows_in_the_repr_when_set() -> None:
    from cellgraph.cluster.ps.config import OptimizerConfig

    assert repr(cg.optim.Adam(0.1)) == "Adam(learning_rate=0.1, beta1=0.9, beta2=0.999, epsilon=1e-08)"
    assert repr(cg.optim.Adam(0.1, amsgrad=True)) == (
        "Adam(learning_rate=0.1, beta1=0.9, beta2=0.999, epsilon=1e-08, amsgrad=True)"
    )
    assert repr(OptimizerConfig("rmsprop", 0.1, centered=True)) == (
        "OptimizerConfig(kind='rmsprop', learning_rate=0.1, decay=0.9, momentum=0.0, epsilon=1e-10, centered=True)"
    )
    assert cg.optim.Adam(0.1).amsgrad is False and cg.optim.RMSProp(0.1, centered=True).centered is True


def test_a_flag_adds_its_slot_only_when_set_and_says_so_in_the_op() -> None:
    """Adam keeps no vhat without amsgrad; an Apply op given the wrong slots for its flags is refused by name."""
    from cellgraph.dataflow.ops.training import apply_optimizer

    g = cg.Graph()
    with g.as_default():
        w = cg.variable([1.0], name="w")
        cg.optim.Adam(0.1).minimize(cg.reduce_sum(w * w))
        assert "Adam/w/vhat" not in {n.name for n in g.variables()}
        slots = {name: cg.variable([0.0], name=f"s/{name}", trainable=False) for name in ("m", "v", "vhat")}
        slots["t"] = cg.variable(0.0, name="s/t", trainable=False)
        lr, grad = cg.constant(0.1, name="lr"), cg.constant([1.0], name="g")
        apply_optimizer("adam", w, slots, lr, grad, {"amsgrad": True})  # takes vhat
        with pytest.raises(
            cg.GraphError,
            match=r"^ApplyAdam \(adam, amsgrad=True\) keeps slots m, v, t, vhat; vhat not given \(given: m, v, t\)$",
        ):
            apply_optimizer("adam", w, {k: v for k, v in slots.items() if k != "vhat"}, lr, grad, {"amsgrad": True})


# A step that mixed precision skips (its float16 gradient overflowed) leaves every slot of every kind as it was:
# AMSGrad's vhat, centered RMSProp's mg, Nadam's step count and schedule product, Adadelta's two averages.
@pytest.mark.parametrize(
    "make",
    [
        lambda: cg.optim.Adam(0.1, amsgrad=True),
        lambda: cg.optim.RMSProp(0.1, momentum=0.5, centered=True),
        lambda: cg.optim.Adamax(0.1),
        lambda: cg.optim.Nadam(0.1),
        lambda: cg.optim.Adadelta(1.0),
    ],
    ids=["amsgrad", "centered", "adamax", "nadam", "adadelta"],
)
def test_mixed_precision_skips_a_step_of_a_new_kind_keeping_every_slot(make) -> None:  # noqa: ANN001
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((2,), name="x")
        w = cg.variable([1.0, -1.0], name="w")
        mp = cg.optim.mixed_precision(make(), initial_scale=1024.0)
        train = mp.minimize(cg.reduce_sum(cg.cast(mp.cast(x) * mp.cast(w), "float32")))
    sess = cg.Session(g)
    for _ in range(2):
        sess.run(train, {x: np.array([1.0, 2.0], np.float32)})  # finite: applied
    before = sess.variable_values()
    assert before["w"].tolist() != [1.0, -1.0]
    with pytest.warns(cg.optim.LossScaleWarning, match="step 3 skipped"):
        sess.run(train, {x: np.array([100.0, 1.0], np.float32)})  # 100 * 1024 > 65504: inf in float16
    after = sess.variable_values()
    slots = [name for name in before if name.count("/w/") == 1]
    assert len(slots) >= 2, slots
    for name in ["w", *slots]:
        np.testing.assert_array_equal(after[name], before[name], err_msg=name)


def test_minimize_without_variables_is_an_error() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((3,), name="x")
        with pytest.raises(
            cg.GradientError, match=r"SGD: 'reduce_sum:0' depends on no trainable variable; nothing to optimise"
        ):
            cg.optim.SGD(0.1).minimize(cg.reduce_sum(x))


def test_global_step_counts_updates_and_slots_are_named_after_variables() -> None:
    g = cg.Graph()
    with g.as_default():
        w = cg.variable([1.0, 2.0], name="w")
        step = cg.variable(0, dtype="int32", name="global_step", trainable=False)
        train = cg.optim.Adam(0.1).minimize(cg.reduce_sum(w * w), global_step=step)
    sess = cg.Session(g)
    for _ in range(3):
        sess.run(train)
    assert sess.run(step) == 3
    assert {"Adam/w/m", "Adam/w/v", "Adam/w/t"} <= {n.name for n in g.variables()}
    assert sess.run(g.tensor("Adam/w/t:0")) == 3.0


# ------------------------------------------------------------------ clip_by_global_norm
def test_clip_by_global_norm_trains_as_torch_clip_grad_norm_does() -> None:
    """SGD on clipped gradients for ten steps: torch divides by (norm + 1e-6), hence the tolerance."""
    g = cg.Graph()
    with g.as_default():
        w = cg.variable(W0, dtype="float64", name="w")
        b = cg.variable(np.zeros(3), dtype="float64", name="b")
        loss = cg.reduce_mean(cg.square(cg.constant(X, "float64") @ w + b - cg.constant(Y, "float64")))
        opt = cg.optim.SGD(0.1)
        grads, variables = zip(*opt.compute_gradients(loss, [w, b]))
        clipped, norm = cg.optim.clip_by_global_norm(list(grads), 0.5)
        train = opt.apply_gradients(list(zip(clipped, variables)))
    sess = cg.Session(g)
    tw, tb = torch.tensor(W0, requires_grad=True), torch.zeros(3, dtype=torch.float64, requires_grad=True)
    topt = torch.optim.SGD([tw, tb], lr=0.1)
    for _ in range(10):
        _, ours = sess.run([train, norm])
        topt.zero_grad()
        ((torch.tensor(X) @ tw + tb - torch.tensor(Y)) ** 2).mean().backward()
        theirs = torch.nn.utils.clip_grad_norm_([tw, tb], 0.5)
        topt.step()
        np.testing.assert_allclose(ours, theirs.item(), rtol=1e-6)
        assert ours > 0.5  # every step is clipped
    np.testing.assert_allclose(sess.run(w), tw.detach().numpy(), rtol=1e-5)
    np.testing.assert_allclose(sess.run(b), tb.detach().numpy(), rtol=1e-5)


def test_clip_by_global_norm_scales_all_together_and_keeps_none() -> None:
    g = cg.Graph()
    with g.as_default():
        a, b = cg.constant([3.0, 4.0], "float64"), cg.constant([[12.0]], "float64")
        (ca, none, cb), norm = cg.optim.clip_by_global_norm([a, None, b], 2.6)
        (same,), small = cg.optim.clip_by_global_norm([a], 5.0)
    got = cg.Session(g).run([ca, cb, norm, same, small])
    assert none is None
    np.testing.assert_allclose(got[0], [0.6, 0.8], rtol=1e-12)
    np.testing.assert_allclose(got[1], [[2.4]], rtol=1e-12)
    assert got[2] == 13.0
    np.testing.assert_array_equal(got[3], [3.0, 4.0])  # within the bound: unchanged, bit for bit
    assert got[4] == 5.0


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda a, i, d: ([a], 0.0), ValueError, "clip_by_global_norm: clip_norm must be a finite number more than 0, got 0.0"),
        (lambda a, i, d: ([a], float("nan")), ValueError, "clip_by_global_norm: clip_norm must be a finite number more than 0, got nan"),
        (lambda a, i, d: ([None, None], 1.0), cg.GraphError, r"clip_by_global_norm: no tensor to clip \(every entry is None\)"),
        (lambda a, i, d: ([i], 1.0), cg.DTypeError, "clip_by_global_norm: 'i:0' has dtype int32; only floating-point tensors can be clipped"),
        (lambda a, i, d: ([a, d], 1.0), cg.DTypeError, "clip_by_global_norm: 'd:0' has dtype float64 and 'a:0' has float32; all must share one dtype"),
    ],
    ids=["zero", "nan", "all-none", "int", "mixed"],
)  # fmt: skip
def test_clip_by_global_norm_refusals_name_the_problem(make, error: type, message: str) -> None:  # noqa: ANN001
    g = cg.Graph()
    with g.as_default():
        a = cg.constant([1.0], "float32", name="a")
        i = cg.constant([1], "int32", name="i")
        d = cg.constant([1.0], "float64", name="d")
        before = g.nodes
        tensors, norm = make(a, i, d)
        with pytest.raises(error, match=f"^{message}$"):
            cg.optim.clip_by_global_norm(tensors, norm)
        assert g.nodes == before


@pytest.mark.parametrize(
    "kind", ["SGD", "Momentum", "Adam", "AdamW", "RMSProp", "Adagrad", "Adamax", "Nadam", "Adadelta"]
)
def test_a_gradient_of_another_run_time_shape_fails_the_update_and_changes_nothing(kind: str) -> None:
    """A gradient of unknown dims passes the shape rule; fed a (1,) gradient for a (3,) variable, every kernel
    updated the first element and read past the gradient's end for the others (-6.9e-311 for SGD, NaN for
    Adadelta) without a word."""
    g = cg.Graph()
    with g.as_default():
        w = cg.variable(np.zeros(3), dtype="float64", name="w")
        x = cg.placeholder((None, None), "float64", name="x")
        make = getattr(cg.optim, kind)
        optimizer = make(0.1, 0.9) if kind == "Momentum" else make(0.1)
        train = optimizer.apply_gradients([(cg.reduce_sum(x, 0), w)])
    sess = cg.Session(g)
    before = sess.variable_values()
    with pytest.raises(cg.ExecutionError) as err:
        sess.run(train, {x: np.ones((2, 1))})
    assert (
        "failed while running: ValueError: the gradient has shape (1,) but the variable 'w' has (3,); an update "
        "needs one gradient element per element of the variable"
    ) in str(err.value)
    after = sess.variable_values()
    assert all(np.array_equal(after[name], value) for name, value in before.items())
    sess.run(train, {x: np.ones((2, 3))})  # the right shape still trains
    assert np.all(sess.run(w) < 0)


def test_a_fed_gradient_is_applied() -> None:
    """apply_gradients of a gradient fed from outside (another process's, say): the update waits for its gradients
    by control, and the fed placeholder was scheduled as a node to run, which failed with 'needs a value'."""
    g = cg.Graph()
    with g.as_default():
        w = cg.variable(np.zeros(3), dtype="float64", name="w")
        fed = cg.placeholder((3,), "float64", name="fed")
        train = cg.optim.SGD(0.5).apply_gradients([(fed, w)])
    sess = cg.Session(g)
    sess.run(train, {fed: np.array([1.0, 2.0, 3.0])})
    np.testing.assert_array_equal(sess.run(w), [-0.5, -1.0, -1.5])
