"""The parameter store: its sync and async rules, every refusal in words, its updates against the local executor's."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cellgraph as cg
from cellgraph.cluster.errors import ParameterServerError
from cellgraph.cluster.ps import records as records_module
from cellgraph.cluster.ps import store as store_module
from cellgraph.cluster.ps.config import SLOTS, OptimizerConfig, TrainingConfig, VariableSpec
from cellgraph.cluster.ps.store import ParameterStore, StoreState, StoreStats

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
SPECS = [VariableSpec("w", F32, (2, 3)), VariableSpec("b", F32, (3,))]
INITIAL = {"w": np.arange(6, dtype=F32).reshape(2, 3), "b": np.zeros(3, F32)}
WAIT_S = 30.0  # bounds a hang of the waits below; no test waits that long when the store works


def make_store(
    mode: str = "async",
    k: int = 1,
    max_staleness: int | None = None,
    kind: str = "sgd",
    lr: float = 0.5,
    replicas: int = 3,
    specs: list[VariableSpec] = SPECS,
    initial: dict[str, np.ndarray] | None = None,
) -> ParameterStore:
    """A store of job 'j' with replicas 0 .. replicas-1 registered."""
    store = ParameterStore(
        "j",
        specs,
        INITIAL if initial is None else initial,
        OptimizerConfig(kind, learning_rate=lr),  # type: ignore[arg-type]
        TrainingConfig(mode, replicas_to_aggregate=k, max_staleness=max_staleness),  # type: ignore[arg-type]
    )
    for replica in range(replicas):
        store.register(replica)
    return store


def grads(value: float = 1.0, **overrides: object) -> dict[str, object]:
    """A gradient for every variable of SPECS, filled with ``value``; ``overrides`` replace or add entries."""
    return {"w": np.full((2, 3), value, F32), "b": np.full(3, value, F32), **overrides}


def snapshot(store: ParameterStore) -> tuple[StoreState, StoreStats]:
    return store.state(), store.stats()


def assert_unchanged(store: ParameterStore, before: tuple[StoreState, StoreStats], rejected: int) -> None:
    """Everything in ``store`` is as in ``before`` except ``rejected`` more refused pushes."""
    state, stats = snapshot(store)
    assert (state.global_step, state.versions) == (before[0].global_step, before[0].versions)
    assert state.tensors.keys() == before[0].tensors.keys()
    for key, value in state.tensors.items():
        np.testing.assert_array_equal(value, before[0].tensors[key], err_msg=key)
    assert stats == replace(before[1], pushes_rejected=before[1].pushes_rejected + rejected)


def raises_code(code: str, message: str, call: Callable[[], object]) -> None:
    """``call()`` raises a ParameterServerError with ``code`` whose message contains ``message``."""
    with pytest.raises(ParameterServerError, match=re.escape(message)) as info:
        call()
    assert info.value.code == code


# ------------------------------------------------------------------ sync mode
def test_sync_applies_the_mean_of_the_first_k_once_and_drops_the_late_one() -> None:
    store = make_store("sync", k=2, replicas=3)
    first = store.push(0, 0, grads(1.0))
    assert (first.status, first.global_step, first.staleness) == ("aggregated", 0, 0)
    np.testing.assert_array_equal(store.read(["w"])[1]["w"][1], INITIAL["w"])  # nothing applied yet
    second = store.push(1, 0, grads(3.0))
    assert (second.status, second.global_step, second.staleness) == ("applied", 1, 0)
    late = store.push(2, 0, grads(100.0))
    assert (late.status, late.global_step, late.staleness) == ("stale", 1, 1)

    step, values = store.read()
    assert step == 1
    # lr 0.5 times the mean 2.0, once; the late gradient of 100 went nowhere.
    np.testing.assert_array_equal(values["w"][1], INITIAL["w"] - 1.0)
    np.testing.assert_array_equal(values["b"][1], INITIAL["b"] - 1.0)
    stats = store.stats()
    assert stats.versions == {"w": 1, "b": 1}
    assert (stats.pushes_applied, stats.pushes_stale, stats.pushes_rejected, stats.updates) == (2, 1, 0, 1)
    assert {rid: (r.pushes, r.last_step) for rid, r in stats.replicas.items()} == {0: (1, 0), 1: (1, 0), 2: (1, 0)}


def test_sync_contributors_are_cleared_after_each_update() -> None:
    store = make_store("sync", k=2, replicas=2)
    for step in range(3):
        assert store.push(0, step, grads()).status == "aggregated"
        assert store.push(1, step, grads()).status == "applied"
    assert store.stats().versions == {"w": 3, "b": 3}
    assert (store.global_step, store.stats().pushes_applied, store.stats().updates) == (3, 6, 3)


def test_sync_duplicate_push_is_refused_and_not_counted_twice() -> None:
    store = make_store("sync", k=2, replicas=2)
    store.push(0, 0, grads(1.0))
    before = snapshot(store)
    raises_code(
        "ALREADY_EXISTS",
        "replica 0 already pushed a gradient for step 0",
        lambda: store.push(0, 0, grads(1000.0)),
    )
    assert_unchanged(store, before, rejected=1)
    store.push(1, 0, grads(3.0))  # the mean is (1 + 3) / 2: the refused 1000 was not summed
    np.testing.assert_array_equal(store.read(["b"])[1]["b"][1], INITIAL["b"] - 1.0)


class WatchedCondition(threading.Condition):
    """The store's condition, telling the test how many threads wait on it: the test acts once they all do."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = 0
        self._watch = threading.Condition()

    def wait(self, timeout: float | None = None) -> bool:
        with self._watch:
            self.waiting += 1
            self._watch.notify_all()
        try:
            return super().wait(timeout)
        finally:
            with self._watch:
                self.waiting -= 1

    def until_waiting(self, count: int) -> None:
        with self._watch:
            assert self._watch.wait_for(lambda: self.waiting >= count, WAIT_S), f"{self.waiting} of {count} waiting"


def watched(store: ParameterStore) -> WatchedCondition:
    """Swap in a WatchedCondition (while no other thread uses the store) and return it."""
    store._lock = condition = WatchedCondition()
    return condition


def test_sync_waiters_are_woken_by_the_update() -> None:
    store = make_store("sync", k=2, replicas=2)
    condition = watched(store)
    with ThreadPoolExecutor(3) as pool:
        waiters = [pool.submit(store.wait_for_step, 1, WAIT_S) for _ in range(3)]
        condition.until_waiting(3)  # all three are blocked in the wait: the update must wake them
        store.push(0, 0, grads())
        assert not any(w.done() for w in waiters)  # an aggregated gradient is no update
        store.push(1, 0, grads())
        assert [w.result(timeout=WAIT_S) for w in waiters] == [1, 1, 1]


def test_wait_for_a_step_already_reached_returns_at_once() -> None:
    store = make_store()
    store.push(0, 0, grads())
    assert store.wait_for_step(1, timeout=0) == 1


@pytest.mark.parametrize(
    ("mode", "k", "pushers", "message"),
    [
        ("sync", 2, [0], "waited 0.05 s for global step 5, still at 4: 1 of 2 gradients for step 4 arrived "
                       "(from replica 0); not yet from replicas 1, 2"),
        ("sync", 2, [], "waited 0.05 s for global step 5, still at 4: 0 of 2 gradients for step 4 arrived; "
                     "not yet from replicas 0, 1, 2"),
        ("sync", 3, [2, 0], "waited 0.05 s for global step 5, still at 4: 2 of 3 gradients for step 4 arrived "
                         "(from replicas 0, 2); not yet from replica 1"),
        ("async", 1, [], "waited 0.05 s for global step 5, still at 4"),
    ],
    ids=["one-arrived", "none-arrived", "two-arrived", "async"],
)  # fmt: skip
def test_wait_timeout_says_who_has_not_pushed(mode: str, k: int, pushers: list[int], message: str) -> None:
    store = make_store(mode, k=k, replicas=3)
    for step in range(4):
        for replica in range(k):
            store.push(replica, step, grads())
    for replica in pushers:
        store.push(replica, 4, grads())
    before = snapshot(store)
    raises_code("DEADLINE_EXCEEDED", message, lambda: store.wait_for_step(5, timeout=0.05))
    assert_unchanged(store, before, rejected=0)


def test_wait_timeout_when_too_few_replicas_are_registered() -> None:
    store = make_store("sync", k=3, replicas=2)
    store.push(0, 0, grads())
    store.push(1, 0, grads())
    raises_code(
        "DEADLINE_EXCEEDED",
        "waited 0.01 s for global step 1, still at 0: 2 of 3 gradients for step 0 arrived (from replicas 0, 1); "
        "no other replica is registered",
        lambda: store.wait_for_step(1, timeout=0.01),
    )


@pytest.mark.parametrize("timeout", [-1.0, float("inf"), float("nan")])
def test_wait_needs_a_finite_deadline(timeout: float) -> None:
    raises_code(
        "INVALID_ARGUMENT",
        f"timeout must be a finite number of seconds, 0 or more, got {timeout}",
        lambda: make_store().wait_for_step(1, timeout),
    )


# ----------------------------------------------------------------- async mode
def test_async_applies_every_push_however_stale_without_a_bound() -> None:
    store = make_store(lr=1.0)
    outcomes = [store.push(0, 0, grads()) for _ in range(4)]
    assert [(o.status, o.global_step, o.staleness) for o in outcomes] == [("applied", i + 1, i) for i in range(4)]
    np.testing.assert_array_equal(store.read(["b"])[1]["b"][1], INITIAL["b"] - 4.0)
    stats = store.stats()
    assert (stats.global_step, stats.versions, stats.pushes_applied, stats.updates) == (4, {"w": 4, "b": 4}, 4, 4)


def test_async_drops_pushes_staler_than_the_bound() -> None:
    store = make_store(max_staleness=1, lr=1.0)
    store.push(0, 0, grads())
    store.push(1, 0, grads())  # staleness 1: still applied
    before = snapshot(store)
    outcome = store.push(2, 0, grads(1000.0))
    assert (outcome.status, outcome.global_step, outcome.staleness) == ("stale", 2, 2)
    state, stats = snapshot(store)
    for key in state.tensors:  # dropped: no value or version moved
        np.testing.assert_array_equal(state.tensors[key], before[0].tensors[key])
    assert (stats.global_step, stats.versions, stats.pushes_applied, stats.pushes_stale) == (2, {"w": 2, "b": 2}, 2, 1)
    assert stats.replicas[2].pushes == 1  # a stale push is still a sign of life
    assert store.push(2, 2, grads()).status == "applied"


# ------------------------------------------------------- refused pushes, their words
@pytest.fixture(params=["sync", "async"])
def busy_store(request: pytest.FixtureRequest) -> ParameterStore:
    """At global step 2; in sync mode (k=2) replica 2's gradient for step 2 is pending."""
    store = make_store(request.param, k=2, replicas=3)
    for step in range(2):
        store.push(0, step, grads())
        if request.param == "sync":
            store.push(1, step, grads())
    if request.param == "sync":
        store.push(2, 2, grads(4.0))
    assert store.global_step == 2
    return store


REFUSED_PUSHES = [
    # id,           replica, step, gradients,                         code,                  message
    ("unregistered", 7, 2, grads(),                                    "FAILED_PRECONDITION", "replica 7 is not registered with job 'j'; call Register first"),
    ("unknown",      0, 2, grads(x=np.ones(3, F32)),                   "NOT_FOUND",           "replica 0 pushed a gradient for 'x', which this shard does not hold; it holds 'w', 'b'"),
    ("missing",      0, 2, {"w": np.ones((2, 3), F32)},                "INVALID_ARGUMENT",    "replica 0's push for step 2 lacks a gradient for 'b'; a push must carry one for every variable of the shard"),
    ("dtype",        0, 2, grads(w=np.ones((2, 3), F64)),              "INVALID_ARGUMENT",    "replica 0's gradient for 'w' has dtype float64, the variable has float32"),
    ("shape",        0, 2, grads(w=np.ones((3, 2), F32)),              "INVALID_ARGUMENT",    "replica 0's gradient for 'w' has shape (3, 2), the variable has (2, 3)"),
    ("not-an-array", 0, 2, grads(b=[1.0, 2.0, 3.0]),                   "INVALID_ARGUMENT",    "replica 0's gradient for 'b' is a list, not a NumPy array"),
    ("negative",     0, -1, grads(),                                   "INVALID_ARGUMENT",    "step -1 is negative"),
    ("future",       0, 3, grads(),                                    "INVALID_ARGUMENT",    "step 3 is from the future: the global step is 2"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("replica", "step", "gradients", "code", "message"),
    [row[1:] for row in REFUSED_PUSHES],
    ids=[row[0] for row in REFUSED_PUSHES],
)
def test_refused_push_changes_nothing(
    busy_store: ParameterStore, replica: int, step: int, gradients: dict, code: str, message: str
) -> None:
    before = snapshot(busy_store)
    raises_code(code, message, lambda: busy_store.push(replica, step, gradients))
    assert_unchanged(busy_store, before, rejected=1)
    # The pending sync gradient (4.0) is intact: replica 0's 2.0 completes the step with mean 3.0.
    outcome = busy_store.push(0, 2, grads(2.0))
    assert (outcome.status, outcome.global_step) == ("applied", 3)
    expected = 3.0 if busy_store.training.mode == "sync" else 2.0
    np.testing.assert_array_equal(
        busy_store.read(["b"])[1]["b"][1], before[0].tensors["b"] - np.float32(0.5) * np.float32(expected)
    )


def test_note_rejected_counts_and_changes_nothing_else(busy_store: ParameterStore) -> None:
    before = snapshot(busy_store)
    busy_store.note_rejected()
    assert_unchanged(busy_store, before, rejected=1)


def test_register_refuses_a_negative_id_and_accepts_a_restart() -> None:
    store = make_store(replicas=1)
    raises_code("INVALID_ARGUMENT", "replica id must be 0 or more, got -1", lambda: store.register(-1))
    store.push(0, 0, grads())
    assert store.register(0) == 1  # a restarted replica learns where the shard is
    assert store.stats().replicas[0].pushes == 1


def test_read_refuses_unknown_names_and_lends_read_only_views() -> None:
    store = make_store()
    raises_code(
        "NOT_FOUND",
        "job 'j': no variable 'x', 'y' on this shard; it holds 'w', 'b'",
        lambda: store.read(["w", "x", "y"]),
    )
    step, values = store.read()
    assert (step, list(values)) == (0, ["w", "b"])
    with pytest.raises(ValueError, match="read-only"):
        values["w"][1][...] = 99.0
    np.testing.assert_array_equal(store.read(["w"])[1]["w"][1], INITIAL["w"])


def test_an_update_copies_a_tensor_only_while_a_reader_holds_it() -> None:
    # Copy on write: a pull is served from the store's own arrays; the update after it writes into a copy
    # while the pull still holds its view (what it sends must not change under it), in place otherwise.
    store = make_store(lr=0.5)
    held = store.read(["w"])[1]["w"][1]
    store.push(0, 0, grads(1.0))
    np.testing.assert_array_equal(held, INITIAL["w"])  # the reader's snapshot did not move
    after = store.read(["w"])[1]["w"][1]
    np.testing.assert_array_equal(after, INITIAL["w"] - 0.5)
    assert not np.shares_memory(held, after)
    del held
    address = after.__array_interface__["data"][0]
    del after  # no reader holds a view now: the next update writes in place
    store.push(0, 1, grads(1.0))
    again = store.read(["w"])[1]["w"][1]
    assert again.__array_interface__["data"][0] == address
    np.testing.assert_array_equal(again, INITIAL["w"] - 1.0)
    # A checkpoint's state is a set of views too, and keeps its values while training goes on.
    state = store.state()
    del again
    store.push(0, 2, grads(1.0))
    np.testing.assert_array_equal(state.tensors["w"], INITIAL["w"] - 1.0)
    np.testing.assert_array_equal(store.read(["w"])[1]["w"][1], INITIAL["w"] - 1.5)


class Clock:
    """The store's ``time`` module, with a wall clock and a performance counter that move only when told."""

    def __init__(self) -> None:
        self.wall, self.counter = 1_700_000_000.0, 50.0

    def time(self) -> float:
        return self.wall

    def perf_counter(self) -> float:
        return self.counter

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.counter += seconds


def test_replica_stats(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(store_module, "time", clock)
    monkeypatch.setattr(records_module, "time", clock)
    store = make_store(replicas=0)
    store.register(4)
    fresh = store.stats().replicas[4]
    assert (fresh.replica_id, fresh.last_step, fresh.pushes, fresh.steps_per_second) == (4, -1, 0, 0.0)
    assert fresh.last_seen == clock.wall
    clock.advance(3.0)
    store.push(4, 0, grads())
    first = store.stats().replicas[4]
    assert (first.steps_per_second, first.last_seen) == (0.0, clock.wall)  # one push is not a rate
    clock.advance(0.25)
    store.push(4, 1, grads())
    seen = store.stats().replicas[4]
    assert (seen.last_step, seen.pushes, seen.last_seen) == (1, 2, clock.wall)
    assert seen.steps_per_second == 4.0  # one push per 0.25 s
    clock.advance(0.5)
    store.push(4, 2, grads())
    # Smoothed: the interval moves RATE_SMOOTHING of the way from 0.25 s to the new 0.5 s.
    interval = 0.25 + records_module.RATE_SMOOTHING * (0.5 - 0.25)
    assert store.stats().replicas[4].steps_per_second == pytest.approx(1.0 / interval)


# ------------------------------------------------------------------ construction
BAD_SHARDS = [
    # id,              specs,                                                  initial,                                       kind,   message
    ("int-dtype",      [VariableSpec("w", np.dtype(np.int32), (2,))],           {"w": np.zeros(2, np.int32)},                  "sgd",  "variable 'w' has dtype int32; a parameter server trains only float32 or float64"),
    ("listed-twice",   [*SPECS, SPECS[0]],                                      INITIAL,                                       "sgd",  "variable 'w' is listed twice in the shard"),
    ("missing",        SPECS,                                                   {"w": INITIAL["w"]},                           "sgd",  "initial values: missing 'b'"),
    ("unexpected",     SPECS,                                                   {**INITIAL, "x": np.zeros(1, F32)},            "sgd",  "initial values: unexpected 'x' (the shard holds 'w', 'b')"),
    ("shape",          SPECS,                                                   {**INITIAL, "w": np.zeros((3, 2), F32)},       "sgd",  "initial value of 'w' has shape (3, 2), the spec says (2, 3)"),
    ("dtype",          SPECS,                                                   {**INITIAL, "b": np.zeros(3, F64)},            "sgd",  "initial value of 'b' has dtype float64, the spec says float32"),
    ("slot-collision", [SPECS[1], VariableSpec("b/m", F32, (3,))],              {"b": INITIAL["b"], "b/m": INITIAL["b"]},      "adam", "variable 'b/m' has the name of slot 'm' of variable 'b'; their checkpoint keys would collide"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("specs", "initial", "kind", "message"), [row[1:] for row in BAD_SHARDS], ids=[row[0] for row in BAD_SHARDS]
)
def test_construction_refuses_a_bad_shard(specs: list[VariableSpec], initial: dict, kind: str, message: str) -> None:
    raises_code("INVALID_ARGUMENT", message, lambda: make_store(kind=kind, specs=specs, initial=initial))


def test_the_store_owns_c_contiguous_copies_of_the_initial_values() -> None:
    initial = {"w": np.asfortranarray(INITIAL["w"]), "b": INITIAL["b"].copy()}
    store = make_store(initial=initial, lr=1.0)
    initial["b"][...] = 99.0
    store.push(0, 0, grads(w=np.asfortranarray(np.arange(6, dtype=F32).reshape(2, 3))))
    # Had the store kept the Fortran-ordered array, the kernel would have updated a temporary copy.
    np.testing.assert_array_equal(store.read()[1]["w"][1], np.zeros((2, 3), F32))
    np.testing.assert_array_equal(store.read()[1]["b"][1], np.full(3, -1.0, F32))


# ------------------------------------------- updates match the local executor's
OPTIMIZERS = {
    "sgd": OptimizerConfig("sgd", learning_rate=0.1),
    "momentum": OptimizerConfig("momentum", learning_rate=0.1, momentum=0.9),
    "nesterov": OptimizerConfig("momentum", learning_rate=0.1, momentum=0.9, nesterov=True),
    "adam": OptimizerConfig("adam", learning_rate=0.01, beta1=0.8, beta2=0.99, epsilon=1e-7),
}
# The local update op for each optimizer kind: (variable, slots, lr, gradient, config) -> training op.
LOCAL_APPLY: dict[str, Callable[..., cg.Tensor]] = {
    "sgd":      lambda w, s, lr, g, o: cg.apply_gradient_descent(w, lr, g),
    "momentum": lambda w, s, lr, g, o: cg.apply_momentum(w, s["momentum"], lr, g, o.momentum, o.nesterov),
    "adam":     lambda w, s, lr, g, o: cg.apply_adam(w, s["m"], s["v"], s["t"], lr, g, o.beta1, o.beta2, o.epsilon),
}  # fmt: skip


def local_run(opt: OptimizerConfig, init: np.ndarray, gradients: list[np.ndarray]) -> dict[str, np.ndarray]:
    """The variable and its slots after a cg.Session ran the Apply* op once per gradient."""
    dtype = init.dtype.name
    graph = cg.Graph()
    with graph.as_default():
        w = cg.variable(init, dtype=dtype, name="w")
        slots = {
            name: cg.variable(
                np.zeros(() if name == "t" else init.shape), dtype=dtype, name=f"w/{name}", trainable=False
            )
            for name in SLOTS[opt.kind]
        }
        grad = cg.placeholder(init.shape, dtype, name="grad")
        train = LOCAL_APPLY[opt.kind](w, slots, cg.constant(opt.learning_rate, dtype=dtype, name="lr"), grad, opt)
    sess = cg.Session(graph)
    for gradient in gradients:
        sess.run(train, {grad: gradient})
    values = sess.run([w, *slots.values()])
    return dict(zip(["w", *(f"w/{name}" for name in slots)], values))


@pytest.mark.parametrize("dtype", [F32, F64], ids=["float32", "float64"])
@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
@pytest.mark.parametrize("mode", ["async", "sync"])
def test_updates_match_the_local_executor_exactly(mode: str, optimizer: str, dtype: np.dtype) -> None:
    rng = np.random.default_rng(0)
    init = rng.normal(size=(3, 4)).astype(dtype)
    gradients = [rng.normal(size=(3, 4)).astype(dtype) for _ in range(6)]
    opt = OPTIMIZERS[optimizer]
    # Sync with k=2 and the same gradient from both replicas: the mean (g + g) / 2 is exactly g.
    k = 2 if mode == "sync" else 1
    store = ParameterStore("j", [VariableSpec("w", dtype, (3, 4))], {"w": init}, opt, TrainingConfig(mode, k))  # type: ignore[arg-type]
    for replica in range(k):
        store.register(replica)
    for step, gradient in enumerate(gradients):
        for replica in range(k):
            store.push(replica, step, {"w": gradient})
    expected = local_run(opt, init, gradients)
    state = store.state()
    assert state.tensors.keys() == expected.keys()
    for key, value in expected.items():
        np.testing.assert_array_equal(state.tensors[key], value, err_msg=key)


# ------------------------------------------------------------------ checkpoints
def trained_adam_store() -> ParameterStore:
    store = make_store(kind="adam", lr=0.1)
    for step in range(3):
        store.push(0, step, grads(float(step + 1)))
    return store


def test_state_round_trip_restores_values_slots_versions_and_step() -> None:
    store = trained_adam_store()
    state = store.state()
    assert list(state.tensors) == ["w", "w/m", "w/v", "w/t", "b", "b/m", "b/v", "b/t"]
    assert (state.global_step, state.versions, float(state.tensors["w/t"])) == (3, {"w": 3, "b": 3}, 3.0)
    store.push(0, 3, grads())  # the state is a snapshot (copy on write): training on does not change it
    assert float(state.tensors["w/t"]) == 3.0
    assert not state.tensors["w"].flags.writeable

    restored = make_store(kind="adam", lr=0.1)
    loaded = StoreState(state.global_step, dict(state.versions), {k: v.copy() for k, v in state.tensors.items()})
    restored.load_state(loaded)
    loaded.tensors["w"][...] = 99.0  # ... and the store keeps its own copy of what it loaded
    again = trained_adam_store()
    for shard in (restored, again):  # the restored store trains on exactly like the original
        shard.push(0, 3, grads())
    ours, theirs = restored.state(), again.state()
    assert (ours.global_step, ours.versions) == (theirs.global_step, theirs.versions) == (4, {"w": 4, "b": 4})
    for key in theirs.tensors:
        np.testing.assert_array_equal(ours.tensors[key], theirs.tensors[key], err_msg=key)


def test_load_state_discards_the_pending_aggregation_and_wakes_waiters() -> None:
    store = make_store("sync", k=2, replicas=2, lr=1.0)
    checkpoint = store.state()
    store.push(0, 0, grads(100.0))
    condition = watched(store)
    with ThreadPoolExecutor(1) as pool:
        waiter = pool.submit(store.wait_for_step, 5, WAIT_S)
        condition.until_waiting(1)
        store.load_state(replace(checkpoint, global_step=5, versions={"w": 5, "b": 5}))
        assert waiter.result(timeout=WAIT_S) == 5
    assert store.push(0, 5, grads(1.0)).status == "aggregated"  # not a duplicate: the old sum is gone
    assert store.push(1, 5, grads(3.0)).status == "applied"
    np.testing.assert_array_equal(store.read(["b"])[1]["b"][1], INITIAL["b"] - 2.0)


def _drop(tensors: dict[str, np.ndarray], key: str) -> dict[str, np.ndarray]:
    return {k: v for k, v in tensors.items() if k != key}


BAD_CHECKPOINTS = [
    # id,               change to a good StoreState,                                                   message
    ("negative-step",   lambda s: replace(s, global_step=-1),                                          "global step -1 is negative"),
    ("missing-slot",    lambda s: replace(s, tensors=_drop(s.tensors, "w/m")),                         "tensors: missing 'w/m'"),
    ("unexpected",      lambda s: replace(s, tensors={**s.tensors, "x": np.zeros(1)}),                 "tensors: unexpected 'x' (the shard holds 'w', 'w/m', 'w/v', 'w/t', 'b', 'b/m', 'b/v', 'b/t')"),
    ("missing-version", lambda s: replace(s, versions={"w": 3}),                                       "versions: missing 'b'"),
    ("negative-version", lambda s: replace(s, versions={"w": -1, "b": 3}),                             "version -1 of 'w' is negative"),
    ("step-count-dtype", lambda s: replace(s, tensors={**s.tensors, "w/t": np.array(3.0, F32)}),      "'w/t' has dtype float32, the shard holds float64"),
    ("slot-shape",      lambda s: replace(s, tensors={**s.tensors, "w/v": np.zeros(3, F32)}),          "'w/v' has shape (3,), the shard holds (2, 3)"),
    ("not-an-array",    lambda s: replace(s, tensors={**s.tensors, "b": [0.0, 0.0, 0.0]}),             "'b' is a list, not a NumPy array"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("change", "message"), [row[1:] for row in BAD_CHECKPOINTS], ids=[row[0] for row in BAD_CHECKPOINTS]
)
def test_load_state_refuses_a_bad_checkpoint_and_changes_nothing(
    change: Callable[[StoreState], StoreState], message: str
) -> None:
    store = trained_adam_store()
    bad = change(trained_adam_store().state())
    before = snapshot(store)
    raises_code("FAILED_PRECONDITION", f"checkpoint for job 'j': {message}", lambda: store.load_state(bad))
    assert_unchanged(store, before, rejected=0)


# ------------------------------------- any interleaving of pushes vs a reference model
@dataclass
class Model:
    """The store's rules for one shard of float64 variables under SGD, written as plainly as possible."""

    mode: str
    k: int
    max_staleness: int | None
    registered: int
    lr: float = 0.5
    step: int = 0
    values: dict[str, np.ndarray] = field(default_factory=lambda: {"w": np.array([1.0, -2.0]), "b": np.array(0.5)})
    pending: list[tuple[int, dict[str, np.ndarray]]] = field(default_factory=list)
    applied: int = 0
    stale: int = 0
    rejected: int = 0
    pushes: dict[int, tuple[int, int]] = field(default_factory=dict)  # replica -> (pushes, last step)

    def push(self, replica: int, step: int, grad: dict[str, np.ndarray], malformed: bool) -> tuple[str, int]:
        """(status or "rejected", staleness) of one push, applying it when the rules say so."""
        duplicate = self.mode == "sync" and step == self.step and replica in [r for r, _ in self.pending]
        if replica >= self.registered or malformed or not 0 <= step <= self.step or duplicate:
            self.rejected += 1
            return "rejected", 0
        self.pushes[replica] = (self.pushes.get(replica, (0, -1))[0] + 1, step)
        staleness = self.step - step
        if self.mode == "async":
            if self.max_staleness is not None and staleness > self.max_staleness:
                self.stale += 1
                return "stale", staleness
            self._update(grad, 1)
            return "applied", staleness
        if staleness:
            self.stale += 1
            return "stale", staleness
        self.pending.append((replica, grad))
        if len(self.pending) < self.k:
            return "aggregated", 0
        total = {name: sum((g[name] for _, g in self.pending), np.zeros_like(v)) for name, v in self.values.items()}
        self._update({name: total[name] / self.k for name in total}, self.k)
        self.pending.clear()
        return "applied", 0

    def _update(self, grad: dict[str, np.ndarray], pushes: int) -> None:
        self.values = {name: value - self.lr * grad[name] for name, value in self.values.items()}
        self.step += 1
        self.applied += pushes


# replica (the last one unregistered), step relative to the global step, gradient seed, malformed (1 in 8)
PUSHES = st.lists(
    st.tuples(st.integers(0, 4), st.integers(-2, 1), st.integers(-3, 3), st.integers(0, 7).map(lambda x: x == 0)),
    max_size=40,
)


def check_against_model(model: Model, pushes: list[tuple[int, int, int, bool]]) -> None:
    specs = [VariableSpec(name, F64, value.shape) for name, value in model.values.items()]
    store = ParameterStore(
        "j",
        specs,
        {name: value.copy() for name, value in model.values.items()},
        OptimizerConfig("sgd", learning_rate=model.lr),
        TrainingConfig(model.mode, model.k, model.max_staleness),  # type: ignore[arg-type]
    )
    for replica in range(model.registered):
        store.register(replica)
    for replica, offset, seed, malformed in pushes:
        step = model.step + offset
        grad = {"w": np.array([seed, 2.0 * seed - 1]), "b": np.array(float(seed + 1))}
        sent = {**grad, "b": np.array([1.0])} if malformed else grad
        try:
            outcome = store.push(replica, step, sent)
            got = (outcome.status, outcome.staleness)
        except ParameterServerError:
            got = ("rejected", 0)
        assert got == model.push(replica, step, grad, malformed)
        assert store.global_step == model.step

    step, values = store.read()
    stats = store.stats()
    assert step == stats.global_step == stats.updates == model.step
    assert stats.versions == dict.fromkeys(model.values, model.step)
    for name, (_, value) in values.items():
        np.testing.assert_array_equal(value, model.values[name], err_msg=name)
    assert (stats.pushes_applied, stats.pushes_stale, stats.pushes_rejected) == (
        model.applied,
        model.stale,
        model.rejected,
    )
    assert {rid: (r.pushes, r.last_step) for rid, r in stats.replicas.items() if r.pushes} == model.pushes


@settings(max_examples=150, deadline=None)
@given(registered=st.integers(1, 4), data=st.data(), pushes=PUSHES)
def test_sync_matches_the_reference_model(registered: int, data: st.DataObject, pushes: list) -> None:
    k = data.draw(st.integers(1, registered), label="k")
    check_against_model(Model("sync", k, None, registered), pushes)


@settings(max_examples=150, deadline=None)
@given(registered=st.integers(1, 4), max_staleness=st.none() | st.integers(0, 3), pushes=PUSHES)
def test_async_matches_the_reference_model(registered: int, max_staleness: int | None, pushes: list) -> None:
    check_against_model(Model("async", 1, max_staleness, registered), pushes)


# --------------------------------------------------------------------- threads
def test_concurrent_async_pushes_are_never_lost() -> None:
    threads, pushes = 16, 200
    store = make_store(
        specs=[VariableSpec("w", F32, (64,))], initial={"w": np.zeros(64, F32)}, lr=1.0, replicas=threads
    )
    start = threading.Barrier(threads)
    ones = {"w": -np.ones(64, F32)}  # lr 1 and a gradient of -1: each update adds 1

    def replica(rid: int) -> None:
        start.wait(timeout=10)
        for _ in range(pushes):
            store.push(rid, 0, ones)

    with ThreadPoolExecutor(threads) as pool:
        for done in [pool.submit(replica, rid) for rid in range(threads)]:
            done.result(timeout=60)
    np.testing.assert_array_equal(store.read()[1]["w"][1], np.full(64, threads * pushes, F32))
    stats = store.stats()
    assert (stats.pushes_applied, stats.updates, stats.global_step) == (3200, 3200, 3200)
    assert all(r.pushes == pushes for r in stats.replicas.values())


def test_concurrent_sync_replicas_step_together() -> None:
    replicas, steps = 4, 50
    store = make_store("sync", k=replicas, replicas=replicas, lr=1.0)

    def replica(rid: int) -> list[str]:
        statuses = []
        for step in range(steps):
            statuses.append(store.push(rid, step, grads(-float(rid))).status)
            store.wait_for_step(step + 1, timeout=10)
        return statuses

    with ThreadPoolExecutor(replicas) as pool:
        running = [pool.submit(replica, rid) for rid in range(replicas)]
        statuses = [status for done in running for status in done.result(timeout=60)]
    assert (statuses.count("applied"), statuses.count("aggregated")) == (steps, steps * (replicas - 1))
    # Each step adds the mean of 0, 1, 2, 3.
    np.testing.assert_array_equal(store.read(["b"])[1]["b"][1], np.full(3, steps * 1.5, F32))
    assert store.stats().pushes_applied == steps * replicas
