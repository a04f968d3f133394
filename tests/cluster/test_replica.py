"""The replica loop against real parameter servers (gRPC on 127.0.0.1, port 0), and ``prepare``'s TrainingGraph."""

from __future__ import annotations

import operator
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import distributed
import numpy as np
import pytest

import cellgraph as cg
from cellgraph.cluster import replica as replica_module
from cellgraph.cluster import replica_loop
from cellgraph.cluster.errors import ParameterServerError
from cellgraph.cluster.ps import OptimizerConfig, ParameterClient, TrainingConfig, create_server, new_token
from cellgraph.cluster.replica import METRIC_KEYS, ReplicaSpec, metrics_topic, run_replica
from cellgraph.cluster.training_graph import TrainingError, TrainingGraph, load, prepare
from cellgraph.examples import digits, models
from cellgraph.protos import graph_pb2

TIMEOUT = 30.0  # seconds: the deadline of every call and every wait in these tests


@contextmanager
def ps_job(
    tg: TrainingGraph,
    shards: int = 1,
    optimizer: OptimizerConfig | None = None,
    training: TrainingConfig | None = None,
    job_id: str = "job",
) -> Iterator[tuple[list[str], str, ParameterClient]]:
    """``shards`` real parameter servers holding ``tg``'s variables: (addresses, token, an observer client)."""
    token = new_token()
    servers = []
    client = None
    try:
        for _ in range(shards):
            servers.append(create_server("127.0.0.1:0", token=token))
        addresses = [f"127.0.0.1:{port}" for _, port in servers]
        client = ParameterClient(addresses, token, timeout=TIMEOUT)
        client.init(job_id, tg.initial, optimizer, training)
        yield addresses, token, client
    finally:
        if client is not None:
            client.close()
        for server, _ in servers:
            server.stop(None).wait(TIMEOUT)


def linear_problem(rows: int = 256) -> tuple[cg.Tensor, list[np.ndarray], np.ndarray]:
    """A least-squares fit of y = X @ [1, -2, 0.5] + 0.3: the loss, the data (X, y) and the solution."""
    rng = np.random.default_rng(0)
    x_data = rng.normal(size=(rows, 3)).astype(np.float32)
    solution = np.array([1.0, -2.0, 0.5], np.float32)
    y_data = (x_data @ solution + 0.3).astype(np.float32)
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 3), "float32", name="x")
        y = cg.placeholder((None,), "float32", name="y")
        w = cg.variable(np.zeros(3, np.float32), name="w")
        b = cg.variable(0.0, name="b")
        pred = cg.reduce_sum(x * w, axis=1) + b
        loss = cg.reduce_mean((pred - y) ** 2.0, name="loss")
    return loss, [x_data, y_data], solution


# ------------------------------------------------------------------ prepare
def test_prepare_mlp_names_gradients_and_initial_values() -> None:
    model = models.mlp()
    nodes_before = len(model.graph)
    tg = prepare(model.loss)
    assert len(model.graph) == nodes_before  # the gradients were built on a copy
    assert tg.loss == model.loss.name
    assert tg.variables == ["hidden/kernel", "hidden/bias", "logits/kernel", "logits/bias"]
    assert tg.placeholders == ["x:0", "y:0"]
    fresh = cg.Session(model.graph).variable_values()
    assert set(tg.initial) == set(tg.variables)
    for name in tg.variables:
        np.testing.assert_array_equal(tg.initial[name], fresh[name])
        assert tg.initial[name].dtype == fresh[name].dtype
    # Only what the loss and its gradients need travels: not the model's Adam slots and updates.
    ops = {node.op for node in graph_pb2.GraphDef.FromString(tg.graphdef).node}
    assert "ApplyAdam" not in ops and "Placeholder" in ops

    # gradients[i] is d loss / d variables[i]: compare with the MLP's gradients derived by hand, in float64 NumPy.
    split = digits.load()
    batch = [split.x_train[:32], split.y_train[:32]]
    loss, grads = load(tg).compute(tg.initial, batch)
    want_loss, want = mlp_loss_and_gradients(tg.initial, *batch)
    assert loss == pytest.approx(want_loss, rel=1e-5)
    for name in tg.variables:
        assert grads[name].shape == tg.initial[name].shape and grads[name].dtype == tg.initial[name].dtype
        np.testing.assert_allclose(grads[name], want[name], rtol=1e-4, atol=1e-6, err_msg=name)


def mlp_loss_and_gradients(
    params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray
) -> tuple[float, dict[str, np.ndarray]]:
    """The loss of ``models.mlp`` (x -> relu dense -> dense -> mean softmax cross-entropy) and its gradients.

    Backpropagation written out: with p = softmax(logits), d loss / d logits = (p - onehot(y)) / N.
    """
    w1, b1 = (params[f"hidden/{v}"].astype(np.float64) for v in ("kernel", "bias"))
    w2, b2 = (params[f"logits/{v}"].astype(np.float64) for v in ("kernel", "bias"))
    x = x.astype(np.float64)
    pre = x @ w1 + b1
    h = np.maximum(pre, 0.0)
    logits = h @ w2 + b2
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    rows = np.arange(len(y))
    loss = float(-log_p[rows, y].mean())
    d_logits = np.exp(log_p)
    d_logits[rows, y] -= 1.0
    d_logits /= len(y)
    d_pre = (d_logits @ w2.T) * (pre > 0)
    grads = {
        "hidden/kernel": x.T @ d_pre,
        "hidden/bias": d_pre.sum(axis=0),
        "logits/kernel": h.T @ d_logits,
        "logits/bias": d_logits.sum(axis=0),
    }
    return loss, grads


def test_prepare_tiny_graph() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 2), "float32", name="x")
        t = cg.placeholder((None,), "float32", name="t")
        w = cg.variable([[1.0], [2.0]], name="w")
        frozen = cg.variable([[0.5]], name="frozen", trainable=False)
        loss = cg.reduce_mean((cg.reshape(x @ (w * frozen), (-1,)) - t) ** 2.0, name="loss")
    nodes_before = len(g)
    tg = prepare(loss, data_feeds=[t, x])  # the data's order, not the graph's
    assert len(g) == nodes_before
    assert tg.variables == ["w"] and tg.loss == "loss:0"
    assert tg.placeholders == ["t:0", "x:0"]
    assert len(tg.gradients) == 1
    np.testing.assert_array_equal(tg.initial["w"], [[1.0], [2.0]])
    x_data, t_data = np.array([[1.0, 1.0], [2.0, 0.0]], np.float32), np.array([0.0, 1.0], np.float32)
    value, grads = load(tg).compute({"w": np.array([[1.0], [2.0]], np.float32)}, [t_data, x_data])
    # residuals r = 0.5 * x @ w - t = [1.5, 0]; loss = mean(r^2); d/dw = mean(2 r * 0.5 x)
    assert value == pytest.approx(1.125)
    np.testing.assert_allclose(grads["w"], [[0.75], [0.75]])


def test_prepare_errors_say_what_to_change() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 2), "float32", name="x")
        w = cg.variable([1.0, 2.0], name="w")
        v = cg.variable([3.0, 1.0], name="v")
        no_variable = cg.reduce_sum(x * 2.0, name="no_variable")
        vector = cg.reduce_sum(x * w, axis=1, name="vector")
        picked = cg.cast(cg.argmax(v, axis=0), "float32")
        not_differentiable = cg.reduce_sum(x * w) + picked
        fit = cg.reduce_sum(x * w, name="fit")
    nodes_before = len(g)
    with pytest.raises(TrainingError, match="'no_variable:0' depends on no trainable variable: there is nothing"):
        prepare(no_variable)
    with pytest.raises(TrainingError, match=r"'vector:0' is \(None,\) float32; a loss must be a float scalar"):
        prepare(vector)
    with pytest.raises(TrainingError, match=r"no gradient flows .* to variable\(s\) 'v': .*trainable=False"):
        prepare(not_differentiable)
    with pytest.raises(
        TrainingError, match=r"'fit:0' needs placeholder\(s\) 'x:0' that get no data \(the data feeds: none\)"
    ):
        prepare(fit, data_feeds=[])
    assert len(g) == nodes_before  # no failure left nodes behind


# ------------------------------------------------------------------ one replica
def test_one_async_replica_fits_a_linear_regression() -> None:
    loss, data, solution = linear_problem()
    tg = prepare(loss)
    with ps_job(tg, optimizer=OptimizerConfig("sgd", 0.1), training=TrainingConfig("async")) as (addrs, token, ps):
        first_loss, _ = load(tg).compute(tg.initial, data)
        messages: list[dict[str, Any]] = []
        spec = ReplicaSpec("job", 0, tg, addrs, token, mode="async", batch_size=32, steps=300, timeout_s=TIMEOUT)
        summary = run_replica(spec, data, emit=messages.append)
        final = ps.pull()
        assert summary["steps"] == 300 and summary["global_step"] == 300 and summary["examples"] == 300 * 32
        assert not summary["stopped"]
        last_loss, _ = load(tg).compute(final.values, data)
        assert last_loss < first_loss / 1000
        assert messages[-1]["final"] and messages[-1]["loss"] < messages[0]["loss"]
        np.testing.assert_allclose(final.values["w"], solution, atol=1e-2)
        assert final.values["b"].item() == pytest.approx(0.3, abs=1e-2)


def test_stop_event_ends_the_replica_after_its_step() -> None:
    loss, data, _ = linear_problem()
    tg = prepare(loss)
    with ps_job(tg, training=TrainingConfig("async")) as (addrs, token, ps):
        stop = threading.Event()
        seen: list[int] = []

        def emit(message: dict[str, Any]) -> None:
            seen.append(message["steps"])
            if message["steps"] == 3:
                # Step 3's metrics go out when its answer is settled, while step 4 computes (its pull hidden
                # behind step 4): step 4 is finished and counted, no fifth begins.
                stop.set()

        spec = ReplicaSpec("job", 0, tg, addrs, token, mode="async", batch_size=16, steps=10_000, metrics_interval_s=0)
        summary = run_replica(spec, data, emit=emit, stop=stop)
        assert summary["stopped"] and summary["steps"] == 4 and summary["global_step"] == 4
        assert ps.pull().global_step == 4
        assert seen == [1, 2, 3, 4, 4]  # one message per step (interval 0), then the final one


class FakeClock:
    """The replica's ``time`` module, with a ``perf_counter`` that moves only when told (and by 2**-20 s a reading,
    so that every interval it measures is positive); wall-clock ``time()`` and the waits stay real."""

    READING = 2.0**-20

    def __init__(self) -> None:
        self.now = 1000.0
        self.time, self.monotonic, self.sleep = time.time, time.monotonic, time.sleep

    def perf_counter(self) -> float:
        self.now += self.READING
        return self.now


class StopAfter:
    """A stop signal that lets ``steps`` steps run, moving ``clock`` on by ``tick`` seconds before each."""

    def __init__(self, steps: int, clock: FakeClock, tick: float) -> None:
        self.steps, self.clock, self.tick, self.asked = steps, clock, tick, 0

    def is_set(self) -> bool:  # the replica asks once, at the start of each step
        self.asked += 1
        self.clock.now += self.tick
        return self.asked > self.steps


def test_metrics_are_rate_limited_and_have_the_documented_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    # Steps 0.25 s apart on the replica's clock, one message per 1 s at most: the first step reports at once,
    # then every fourth step, and the stop sends a final one. Binary fractions: the clock's sums are exact.
    loss, data, _ = linear_problem()
    tg = prepare(loss)
    interval, tick, batch = 1.0, 0.25, 16
    clock = FakeClock()
    monkeypatch.setattr(replica_module, "time", clock)
    monkeypatch.setattr(replica_loop, "time", clock)
    with ps_job(tg, training=TrainingConfig("async")) as (addrs, token, _):
        messages: list[dict[str, Any]] = []
        # overlap=False: each step is counted when it ends, before the next begins (with the overlap, a step is
        # counted during the next one, when its answer is settled: the same messages, a tick later).
        spec = ReplicaSpec(
            "job", 7, tg, addrs, token, mode="async", batch_size=batch, steps=10**9, metrics_interval_s=interval,
            overlap=False,
        )  # fmt: skip
        summary = run_replica(spec, data, emit=messages.append, stop=StopAfter(30, clock, tick))
    assert summary["stopped"] and summary["steps"] == 30 and summary["global_step"] == 30
    assert [m["steps"] for m in messages] == [1, 5, 9, 13, 17, 21, 25, 29, 30]
    assert [m["final"] for m in messages] == [False] * 8 + [True]
    # Examples over the window's time: 16 in 0.25 s at the first step, 4 x 16 in 1 s after; the final window
    # (step 30) lasts until the stop, a tick after that step began: 16 in 0.5 s.
    rates = [batch / tick] * 8 + [batch / (2 * tick)]
    assert [m["examples_per_s"] for m in messages] == pytest.approx(rates, rel=1e-3)
    for message in messages:
        assert tuple(message) == METRIC_KEYS
        assert message["replica"] == 7 and message["job"] == "job" and message["step"] == message["steps"]
        assert isinstance(message["loss"], float) and message["staleness"] == 0
        assert 0 < message["step_time_s"] < tick  # a step's own time, not the gaps between steps
    assert all(a["time"] <= b["time"] for a, b in zip(messages, messages[1:]))
    assert messages[-1]["steps"] == summary["steps"] and messages[-1]["step"] == summary["global_step"]
    # Each step pushes a gradient and pulls a value of every variable.
    per_step = 2 * sum(np.asarray(v).nbytes for v in tg.initial.values())
    assert [m["ps_bytes"] for m in messages] == [m["steps"] * per_step for m in messages]
    # Every step's loss reached the messages, in order, however few the messages were.
    steps = [s for m in messages for s in m["step_losses"]["step"]]
    assert steps == [float(s) for s in range(1, 31)]
    assert [m["step_losses"]["loss"][-1] for m in messages] == [m["loss"] for m in messages]


def test_replica_errors_name_the_replica_and_what_to_change() -> None:
    loss, data, _ = linear_problem()
    tg = prepare(loss)
    with ps_job(tg, training=TrainingConfig("async")) as (addrs, token, _):
        spec = ReplicaSpec("job", 2, tg, addrs, token, mode="sync", batch_size=16, steps=5, timeout_s=TIMEOUT)
        with pytest.raises(TrainingError, match="replica 2 of job 'job' was started in sync mode, but .* async"):
            run_replica(spec, data)
        big = ReplicaSpec("job", 2, tg, addrs, token, mode="async", batch_size=1000, steps=5)
        with pytest.raises(TrainingError, match="replica 2 of job 'job': its shard has 256 row.*batch_size 1000"):
            run_replica(big, data)
        wrong_token = ReplicaSpec("job", 2, tg, addrs, "not-the-token", mode="async", steps=5, timeout_s=5)
        with pytest.raises(ParameterServerError, match=r"replica 2 of job 'job', joining the job: parameter server"):
            run_replica(wrong_token, data)
        wrong_data = [data[0][:, :2], data[1]]
        with pytest.raises(TrainingError, match=r"replica 2 of job 'job': data for placeholder 'x:0': .*\(256, 2\)"):
            run_replica(ReplicaSpec("job", 2, tg, addrs, token, mode="async", steps=5), wrong_data)
    with pytest.raises(TrainingError, match="batch_size must be at least 1"):
        ReplicaSpec("job", 2, tg, addrs, token, batch_size=0)


def run_in_threads(specs: list[ReplicaSpec], shards: list[list[np.ndarray]]) -> list[dict[str, Any]]:
    """Run one replica per spec, each in its own thread, and return their summaries (raising their errors)."""
    results: dict[int, dict[str, Any]] = {}
    errors: list[BaseException] = []

    def replica(i: int) -> None:
        try:
            results[i] = run_replica(specs[i], shards[i])
        except BaseException as err:  # re-raised below, in the test's thread
            errors.append(err)

    threads = [threading.Thread(target=replica, args=(i,)) for i in range(len(specs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT * 2)
    assert not any(thread.is_alive() for thread in threads), "a replica did not finish in time"
    if errors:
        raise errors[0]
    return [results[i] for i in range(len(specs))]


def test_sync_with_a_backup_replica_applies_each_step_once() -> None:
    steps = 60
    loss, data, solution = linear_problem(rows=240)
    tg = prepare(loss)
    training = TrainingConfig("sync", replicas_to_aggregate=2)  # three replicas: one is a backup at every step
    with ps_job(tg, optimizer=OptimizerConfig("sgd", 0.1), training=training) as (addrs, token, ps):
        specs = [
            ReplicaSpec("job", i, tg, addrs, token, mode="sync", batch_size=16, steps=steps, timeout_s=TIMEOUT)
            for i in range(3)
        ]
        summaries = run_in_threads(specs, [[array[i::3] for array in data] for i in range(3)])
        [stats] = ps.stats()
        final = ps.pull()
    assert [s["global_step"] for s in summaries] == [steps] * 3
    assert stats.updates == steps and stats.pushes_applied == 2 * steps
    # Every push was applied, or dropped as stale (a backup's), never refused.
    assert stats.pushes_applied + stats.pushes_stale == sum(s["steps"] for s in summaries)
    np.testing.assert_allclose(final.values["w"], solution, atol=0.05)


# ------------------------------------------------------------------ sync, two replicas, the digits MLP
def test_two_sync_replicas_train_the_digits_mlp(record_property: Callable[[str, object], None]) -> None:
    steps, batch = 250, 64
    model = models.mlp()
    tg = prepare(model.loss)
    split = digits.load()
    half = len(split.x_train) // 2
    shards = [
        [split.x_train[:half], split.y_train[:half]],
        [split.x_train[half:], split.y_train[half:]],
    ]
    training = TrainingConfig("sync", replicas_to_aggregate=2)
    with ps_job(tg, shards=2, optimizer=OptimizerConfig("adam", 1e-2), training=training) as (addrs, token, ps):
        specs = [
            ReplicaSpec("job", i, tg, addrs, token, mode="sync", batch_size=batch, steps=steps, seed=i)
            for i in range(2)
        ]
        started = time.perf_counter()
        results = run_in_threads(specs, shards)
        seconds = time.perf_counter() - started
        final = ps.pull()
        stats = ps.stats()

    assert {r["global_step"] for r in results} == {steps}
    assert all(shard.updates == steps and shard.pushes_applied == 2 * steps for shard in stats)
    sess = cg.Session(model.graph)
    for name, value in final.values.items():
        sess.variables.load(model.graph.node(name), value)
    accuracy = float(sess.run(model.accuracy, {model.x: split.x_test, model.y: split.y_test}))
    record_property("steps_per_s", steps / max(r["seconds"] for r in results))
    record_property("seconds", seconds)
    record_property("test_accuracy", accuracy)
    assert accuracy >= 0.9


# ------------------------------------------------------------------ inside Dask
@pytest.mark.slow
def test_replica_runs_as_a_dask_task_and_logs_events() -> None:
    loss, data, solution = linear_problem()
    tg = prepare(loss)
    job, steps = "dask-job", 1500  # enough to fit the solution to 1e-2
    sgd, training = OptimizerConfig("sgd", 0.05), TrainingConfig("async")
    with ps_job(tg, optimizer=sgd, training=training, job_id=job) as (addrs, token, ps):
        # dashboard_address=None turns the dashboard off but still binds its HTTP server to 8787: ":0" never clashes.
        cluster = distributed.LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=":0"
        )
        try:
            with distributed.Client(cluster, timeout=TIMEOUT) as client:
                events: list[dict[str, Any]] = []
                got_first, got_enough, got_final = threading.Event(), threading.Event(), threading.Event()

                def on_event(event: tuple[float, dict[str, Any]]) -> None:
                    events.append(event[1])
                    got_first.set()
                    if event[1]["step"] >= steps:
                        got_enough.set()
                    if event[1]["final"]:
                        got_final.set()

                client.subscribe_topic(metrics_topic(job), on_event)
                # The replica runs until told to stop: nothing it does can end it before this test has looked.
                stop = distributed.Event(f"{job}-stop", client=client)
                spec = ReplicaSpec(
                    job, 0, tg, addrs, token, mode="async", batch_size=16, steps=10**9, metrics_interval_s=0.1
                )
                future = client.submit(run_replica, spec, data, stop=stop, pure=False)
                assert got_first.wait(TIMEOUT), "no metrics event arrived from the replica"
                # The replica seceded from the worker's only thread: another task runs beside it (else this one
                # would wait for the replica, which waits for the stop below).
                assert client.submit(operator.add, 1, 2, pure=False).result(timeout=TIMEOUT) == 3
                assert future.status == "pending", future.result(timeout=TIMEOUT)  # raises the replica's error
                assert got_enough.wait(TIMEOUT), f"the replica did not reach step {steps}: {events[-1:]}"
                stop.set()
                summary = future.result(timeout=TIMEOUT)
                # The final message is a Dask event too: it may arrive after the task's result.
                assert got_final.wait(TIMEOUT), "the replica's final metrics event did not arrive"
        finally:
            cluster.close(timeout=TIMEOUT)
        assert summary["stopped"] and summary["global_step"] >= steps and summary["steps"] == summary["global_step"]
        assert events[-1]["final"] and events[-1]["step"] == summary["global_step"]
        assert set(METRIC_KEYS) <= set(events[-1])
        np.testing.assert_allclose(ps.pull().values["w"], solution, atol=1e-2)


# ------------------------------------------------------------------ servers that move
def test_a_replica_rejoins_servers_at_new_addresses_and_gives_up_on_none() -> None:
    loss, data, _ = linear_problem()
    tg = prepare(loss)
    token = new_token()
    training = TrainingConfig("async")
    old, old_port = create_server("127.0.0.1:0", token=token)
    new, new_port = create_server("127.0.0.1:0", token=token)
    published = (0, [f"127.0.0.1:{old_port}"])
    try:
        for port in (old_port, new_port):
            with ParameterClient([f"127.0.0.1:{port}"], token, timeout=TIMEOUT) as client:
                client.init("job", tg.initial, None, training)
        stop = threading.Event()

        def emit(message: dict[str, Any]) -> None:
            nonlocal published
            if message["steps"] == 5 and published[0] == 0:
                old.stop(None).wait(TIMEOUT)  # the first server is lost; a new one is published
                published = (1, [f"127.0.0.1:{new_port}"])

        spec = ReplicaSpec(
            "job", 0, tg, published[1], token, mode="async", batch_size=16, steps=40, metrics_interval_s=0
        )
        summary = run_replica(spec, data, emit=emit, stop=stop, locate=lambda: published)
        assert summary["rejoins"] == 1 and summary["global_step"] == 40
        # Servers that stop answering, and nothing published in their place: the replica gives up, naming them.
        new.stop(None).wait(TIMEOUT)
        short = ReplicaSpec("job", 0, tg, published[1], token, mode="async", batch_size=16, steps=80, timeout_s=1)
        with pytest.raises(ParameterServerError) as err:
            run_replica(short, data, locate=lambda: published)
        assert err.value.code == "UNAVAILABLE"
        assert (
            f"replica 0 of job 'job': parameter server(s) 127.0.0.1:{new_port} stopped answering at global step 0, "
            "and none answered in the 2 s since (generation 1 of the job's addresses)"
        ) in str(err.value)
        assert "The replica gives up, and the job fails with it (Dask never runs a replica task again)" in str(
            err.value
        )
    finally:
        old.stop(None)
        new.stop(None)


def test_replicas_of_other_seeds_draw_other_dropout_masks() -> None:
    # Replica i's spec has the job's seed plus i (ReplicaSet): its session's random ops are seeded with it, so two
    # replicas do not mask the same positions at every step, as one process does not for the rows of one batch.
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 64), "float32", name="x")
        w = cg.variable(np.ones(64, np.float32), name="w")
        loss = cg.reduce_sum(cg.dropout(x * w, 0.5, seed=3), name="loss")
    tg = prepare(loss)
    data = [np.ones((4, 64), np.float32)]

    def trained(seed: int) -> np.ndarray:
        with ps_job(tg, optimizer=OptimizerConfig("sgd", 0.1), training=TrainingConfig("async")) as (a, t, ps):
            spec = ReplicaSpec("job", 0, tg, a, t, mode="async", batch_size=4, steps=1, seed=seed, timeout_s=TIMEOUT)
            run_replica(spec, data, emit=lambda _: None)
            return ps.pull().values["w"]

    first, second = trained(0), trained(1)
    assert not np.array_equal(first, second)
    np.testing.assert_array_equal(trained(0), first)  # a seed replays its masks
    assert 0 < np.mean(first != 1.0) < 1  # the step moved the kept positions only
