"""The parameter service end to end: real servers, real clients, the training rules over gRPC."""

from __future__ import annotations

import re
import threading
import weakref

import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import cellgraph as cg
from cellgraph.cluster.errors import ParameterServerError
from cellgraph.cluster.ps import OptimizerConfig, TrainingConfig

from .conftest import TIMEOUT, Servers


def model(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "dense/w": rng.standard_normal((40, 8)).astype(np.float32),
        "dense/b": rng.standard_normal(8).astype(np.float32),
        "head/w": rng.standard_normal((8, 3)).astype(np.float64),
    }


def test_a_variable_split_over_two_shards_is_pulled_and_pushed_whole(ps: Servers) -> None:
    ps.start(2)
    client = ps.client()
    values = model()
    client.init("split", values, OptimizerConfig("sgd", learning_rate=0.5), split_threshold=400)
    pieces = client.layout["dense/w"]  # type: ignore[index]
    assert [(shard, spec.rows) for shard, spec in pieces] == [(0, (0, 20)), (1, (20, 40))] or [
        (shard, spec.rows) for shard, spec in pieces
    ] == [(1, (0, 20)), (0, (20, 40))]
    pulled = client.pull()
    for name, value in values.items():
        np.testing.assert_array_equal(pulled.values[name], value)
    client.register(0)
    grads = {name: np.ones_like(value) for name, value in values.items()}
    assert client.push(grads, step=0, replica_id=0).status == "applied"
    after = client.pull()
    for name, value in values.items():
        np.testing.assert_array_equal(after.values[name], value - value.dtype.type(0.5))
    stats = client.stats()
    held = [{v.name for v in s.variables} for s in stats]
    assert "dense/w" in held[0] and "dense/w" in held[1]
    assert after.global_step == 1 and after.versions["dense/w"] == 1


def test_sync_with_a_backup_replica_applies_each_step_once(ps: Servers) -> None:
    """n = 3 replicas, k = 2: every step applies the mean of the first two, the third is dropped as stale."""
    ps.start(2)
    values = model()
    steps, replicas = 12, 3
    ps.client().init(
        "sync", values, OptimizerConfig("sgd", learning_rate=1.0), TrainingConfig("sync", replicas_to_aggregate=2)
    )
    errors: list[BaseException] = []

    def replica(rid: int) -> None:
        try:
            client = ps.client()
            info = client.register(rid)
            step = info.global_step
            while step < steps:
                pulled = client.pull(min_step=step)
                step = pulled.global_step
                if step >= steps:
                    break
                # Every replica's gradient for step s is the same, so the mean of any two is known.
                grads = {n: np.full_like(v, step + 1) for n, v in pulled.values.items()}
                if rid == 0:  # one replica takes the fused call: push, then wait for the update it joined
                    result, after = client.push_pull(grads, step=step, replica_id=rid, min_step=step + 1)
                    assert after.global_step >= step + 1 or result.status == "stale"
                else:
                    result = client.push(grads, step=step, replica_id=rid)
                assert result.status in ("applied", "aggregated", "stale")
                step += 1
        except BaseException as err:  # noqa: BLE001 - reported by the main thread
            errors.append(err)

    threads = [threading.Thread(target=replica, args=(r,)) for r in range(replicas)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT * 3)
    assert not any(t.is_alive() for t in threads), "a replica hung"
    assert not errors, errors
    final = ps.client().pull()
    assert final.global_step == steps
    total = sum(range(1, steps + 1))
    for name, value in values.items():
        np.testing.assert_allclose(final.values[name], value - total, rtol=1e-6)
    for shard in ps.client().stats():
        assert shard.updates == steps
        assert shard.pushes_applied == 2 * steps  # no gradient applied twice, none lost
        assert shard.pushes_applied + shard.pushes_stale <= replicas * steps
        assert all(v.version == steps for v in shard.variables)
        assert {r.replica_id for r in shard.replicas} == {0, 1, 2}


def test_async_replicas_each_apply_on_arrival(ps: Servers) -> None:
    ps.start(2)
    values = {"w": np.zeros((64, 4), np.float64), "b": np.zeros(4, np.float64)}
    ps.client().init("async", values, OptimizerConfig("sgd", learning_rate=1.0), TrainingConfig("async"))
    pushes, replicas = 25, 4

    def replica(rid: int) -> None:
        client = ps.client()
        client.register(rid)
        for _ in range(pushes):
            pulled = client.pull()
            client.push(
                {n: -np.ones_like(v) for n, v in pulled.values.items()}, step=pulled.global_step, replica_id=rid
            )

    threads = [threading.Thread(target=replica, args=(r,)) for r in range(replicas)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT * 3)
    final = ps.client().pull()
    for value in final.values.values():
        assert (value == pushes * replicas).all()
    assert [s.pushes_applied for s in ps.client().stats() if s.variables] == [pushes * replicas] * 2


def test_async_staleness_bound_tells_the_replica_to_pull_again(ps: Servers) -> None:
    ps.start(1)
    client = ps.client()
    client.init("bound", {"w": np.zeros(3)}, OptimizerConfig("sgd", 1.0), TrainingConfig("async", max_staleness=1))
    client.register(0)
    grad = {"w": np.ones(3)}
    for step in range(3):
        assert client.push(grad, step=step, replica_id=0).status == "applied"
    result = client.push(grad, step=1, replica_id=0)  # computed from version 1, now at 3: staleness 2 > 1
    assert (result.status, result.staleness, result.global_step) == ("stale", 2, 3)
    assert client.stats()[0].pushes_stale == 1


def test_the_layout_follows_the_graph_placement(ps: Servers) -> None:
    ps.start(2)
    g = cg.Graph()
    with g.as_default():
        big = cg.variable(np.zeros((1000, 10), np.float32), name="big")
        small = cg.variable(np.zeros(10, np.float32), name="small")
        cg.reduce_sum(cg.matmul(big, cg.reshape(small, (10, 1))))
    devices = ["/job:ps/task:0/device:cpu:0", "/job:ps/task:1/device:cpu:0", "/job:worker/task:0/device:cpu:0"]
    placement = cg.placement.place(g, devices)
    client = ps.client()
    values = {"big": np.arange(10000, dtype=np.float32).reshape(1000, 10), "small": np.ones(10, np.float32)}
    client.init("placed", values, placement=placement)
    where = {name: [shard for shard, _ in pieces] for name, pieces in client.layout.items()}  # type: ignore[union-attr]
    expected = {
        name: [
            int(d.split("task:")[1][0])
            for d, _, _ in placement.partitions.get(name, [(placement.device_of[name], 0, 0)])
        ]
        for name in values
    }
    assert where == expected
    np.testing.assert_array_equal(client.pull().values["big"], values["big"])


def test_init_again_is_harmless_and_another_job_is_refused(ps: Servers) -> None:
    ps.start(1)
    client = ps.client()
    client.init("first", {"w": np.zeros(2)}, OptimizerConfig("sgd", 1.0))
    client.register(0)
    client.push({"w": np.ones(2)}, step=0, replica_id=0)
    assert client.init("first", {"w": np.zeros(2)}, OptimizerConfig("sgd", 1.0)) == 1  # values untouched
    np.testing.assert_array_equal(client.pull().values["w"], [-1.0, -1.0])
    with pytest.raises(
        ParameterServerError, match="already holds job 'first'; job 'second' needs a server of its own"
    ) as err:
        client.init("second", {"w": np.zeros(2)})
    assert err.value.code == "FAILED_PRECONDITION"


def test_a_sync_pull_that_waits_too_long_says_who_it_waits_for(ps: Servers) -> None:
    ps.start(1)
    client = ps.client()
    client.init("wait", {"w": np.zeros(2)}, training=TrainingConfig("sync", replicas_to_aggregate=2))
    client.register(0)
    client.register(1)
    client.push({"w": np.ones(2)}, step=0, replica_id=0)
    with pytest.raises(ParameterServerError) as err:
        client.pull(min_step=1, timeout=0.5)
    assert err.value.code == "DEADLINE_EXCEEDED"
    assert "global step 1" in str(err.value) and "replica 1" in str(err.value)


def test_save_and_restore_through_the_service(ps: Servers) -> None:
    ps.start(2, checkpoint_dir=ps.tmp_path / "ckpt")
    client = ps.client()
    values = model()
    client.init("ckpt", values, OptimizerConfig("adam", learning_rate=0.1), split_threshold=400)
    client.register(0)
    grads = {n: np.ones_like(v) for n, v in values.items()}
    client.push(grads, step=0, replica_id=0)
    saved = client.pull()
    name = client.save()
    assert name == "ckpt-0000000001"
    for step in (1, 2):
        client.push(grads, step=step, replica_id=0)
    assert client.pull().global_step == 3
    assert client.restore() == 1
    back = client.pull()
    for n in values:
        np.testing.assert_array_equal(back.values[n], saved.values[n])
    # Adam's slots came back too: the next update is the one that followed the save.
    client.push(grads, step=1, replica_id=0)
    replay = client.pull()
    client.restore(name)
    client.push(grads, step=1, replica_id=0)
    for n in values:
        np.testing.assert_array_equal(client.pull().values[n], replay.values[n])


def test_restore_refuses_a_checkpoint_of_other_variables_and_changes_nothing(ps: Servers) -> None:
    directory = ps.tmp_path / "shared"
    [first, second] = ps.start(2, checkpoint_dir=directory)
    one = ps.client([first])
    one.init("a", {"w": np.zeros((2, 3), np.float32)})
    one.save()
    other = ps.client([second])
    other.init("b", {"w": np.zeros((3, 2), np.float32)})
    other.register(0)
    other.push({"w": np.ones((3, 2), np.float32)}, step=0, replica_id=0)
    before = other.pull()
    with pytest.raises(
        ParameterServerError,
        match=r"checkpoint ckpt-0000000000 has 'w' as float32 \(2, 3\), the job holds float32 \(3, 2\)",
    ) as err:
        other.restore()
    assert err.value.code == "FAILED_PRECONDITION"
    after = other.pull()
    np.testing.assert_array_equal(after.values["w"], before.values["w"])
    assert (after.global_step, after.versions) == (before.global_step, before.versions)


def test_health_answers_without_a_token(ps: Servers) -> None:
    ps.start(1)
    import grpc

    with grpc.insecure_channel(ps.addresses[0]) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", "cellgraph.ParameterService"):
            answer = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=TIMEOUT)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING


def test_an_unreachable_server_is_named_after_the_retries(ps: Servers) -> None:
    client = ps.client(["127.0.0.1:1"], timeout=2.0, retries=3, backoff=0.01)
    with pytest.raises(
        ParameterServerError,
        match=r"parameter server 127\.0\.0\.1:1 \(shard 0\) did not answer Stats after 3 attempt\(s\)",
    ) as err:
        client.stats()
    assert err.value.code == "UNAVAILABLE"


def test_steps_go_over_one_held_stream_per_shard_small_and_big(ps: Servers) -> None:
    from cellgraph.cluster.ps.step_requests import ONE_MESSAGE_BYTES

    ps.start(2)
    client = ps.client()
    big = np.zeros(ONE_MESSAGE_BYTES // 4 + 300_000, np.float32)  # over one message: the push and pull go in pieces
    values = {"big": big, "small": np.zeros(4, np.float32)}
    client.init("held", values, OptimizerConfig("sgd", 1.0), split_threshold=1 << 40)
    client.register(0)
    where = {name: pieces[0][0] for name, pieces in client.layout.items()}  # type: ignore[union-attr]
    assert where["big"] != where["small"]
    grads = {name: -np.ones_like(v) for name, v in values.items()}  # lr 1: each value goes up by 1 a step
    for step in range(3):
        pushed, pulled = client.push_pull(grads, step=step, replica_id=0)
        assert pushed.status == "applied" and pushed.by_shard == ("applied", "applied")
        assert pulled.global_step == step + 1
        for name in values:
            assert (pulled.values[name] == step + 1).all(), name
    client.push(grads, step=3, replica_id=0)
    assert (client.pull(["big"]).values["big"] == 4).all()
    for name in values:
        calls = dict(client.stats()[where[name]].calls)
        # Five steps, one stream: no call per step, and none of the one-shot RPCs.
        assert calls.get("Step") == 1, calls
        assert not {"Push", "Pull", "PushPull"} & set(calls), calls
    with pytest.raises(ParameterServerError, match="a push needs at least one gradient"):
        client.push_pull({}, step=1, replica_id=0)


def test_pull_out_reuses_the_callers_buffers_and_refuses_a_wrong_one(ps: Servers) -> None:
    ps.start(2)
    client = ps.client()
    values = {"w": np.arange(12, dtype=np.float32).reshape(6, 2), "b": np.ones(3, np.float64)}
    client.init("out", values, OptimizerConfig("sgd", 1.0), split_threshold=16)  # w is split over both shards
    client.register(0)
    out = {"w": np.zeros((6, 2), np.float32), "b": np.zeros(3, np.float64)}
    pulled = client.pull(out=out)
    assert pulled.values["w"] is out["w"] and pulled.values["b"] is out["b"]
    np.testing.assert_array_equal(out["w"], values["w"])
    np.testing.assert_array_equal(out["b"], values["b"])
    _, again = client.push_pull({"w": np.ones((6, 2), np.float32), "b": np.zeros(3)}, step=0, replica_id=0, out=out)
    assert again.values["w"] is out["w"]
    np.testing.assert_array_equal(out["w"], values["w"] - 1)
    cases = {
        "out['w'] is a float64 array of shape (6, 2); it must be a writable C-contiguous float32 array of shape (6, 2)": {
            "w": np.zeros((6, 2))
        },
        "out['w'] is a non-contiguous float32 array of shape (6, 2)": {"w": np.zeros((2, 6), np.float32).T},
        "out['b'] is a read-only float64 array of shape (3,)": {"b": np.zeros(3).view()},
        "out['w'] is a list": {"w": [0.0] * 12},
        "pull(out=...) names 'zz', which this pull does not fetch; it fetches: w, b": {"zz": np.zeros(1)},
    }
    cases["out['b'] is a read-only float64 array of shape (3,)"]["b"].flags.writeable = False
    for words, bad in cases.items():
        with pytest.raises(ParameterServerError, match=re.escape(words)) as err:
            client.pull(out=bad)  # type: ignore[arg-type]
        assert err.value.code == "INVALID_ARGUMENT"


def test_a_kept_pull_plan_is_used_again_only_for_the_same_writable_arrays(ps: Servers) -> None:
    ps.start(2)
    client = ps.client()
    values = {"w": np.arange(12, dtype=np.float32).reshape(6, 2), "b": np.ones(3, np.float64)}
    client.init("plans", values, OptimizerConfig("sgd", 1.0), split_threshold=16)
    client.register(0)
    out = {"w": np.zeros((6, 2), np.float32), "b": np.zeros(3, np.float64)}
    grads = {"w": np.ones((6, 2), np.float32), "b": np.ones(3)}
    results = [client.push_pull(grads, step=s, replica_id=0, out=out)[1] for s in range(3)]
    assert len(client._plans) == 1  # one plan, kept and used three times
    for step, result in enumerate(results):
        assert result.values["w"] is out["w"] and result.global_step == step + 1
    assert results[0].values is not results[1].values  # each result has a dict of its own
    np.testing.assert_array_equal(out["w"], values["w"] - 3)
    results[0].values.clear()  # a caller's change to a result does not reach the kept plan
    assert client.pull(out=out).values.keys() == {"w", "b"}
    out["b"].flags.writeable = False  # the same array, read-only now: refused in words, not written into
    with pytest.raises(ParameterServerError, match=re.escape("out['b'] is a read-only float64 array of shape (3,)")):
        client.pull(out=out)
    np.testing.assert_array_equal(out["b"], values["b"] - 3)
    other = {"w": np.zeros((6, 2), np.float32), "b": np.zeros(3)}
    np.testing.assert_array_equal(client.pull(out=other).values["w"], values["w"] - 3)
    assert client.pull(out=other).values["w"] is other["w"]
    fresh = client.pull(["w"], out={})  # no arrays of the caller's: a new array every time
    assert fresh.values["w"] is not client.pull(["w"], out={}).values["w"]
    arrays = weakref.ref(other["w"])
    for _ in range(3):  # new arrays each pull: the plans of the earlier ones are not kept, nor their arrays
        client.pull(out={"w": np.zeros((6, 2), np.float32), "b": np.zeros(3)})
    del other
    assert arrays() is None and len(client._plans) == 1


def test_a_sync_replica_keeps_one_pull_plan_while_its_min_step_grows(ps: Servers) -> None:
    # Each step's pull waits for a later global step: the kept plan's bytes get each step's min_step appended.
    ps.start(2)
    client = ps.client()
    values = {"w": np.arange(12, dtype=np.float32).reshape(6, 2), "b": np.ones(3, np.float64)}
    client.init("grow", values, OptimizerConfig("sgd", 1.0), TrainingConfig("sync"), split_threshold=16)
    client.register(0)
    out = {"w": np.zeros((6, 2), np.float32), "b": np.zeros(3, np.float64)}
    grads = {"w": np.ones((6, 2), np.float32), "b": np.ones(3)}
    plans = []
    for step in range(2):
        _, pulled = client.push_pull(grads, step=step, replica_id=0, min_step=step + 1, out=out)
        assert pulled.global_step == step + 1
        plans += client._plans.values()
    streamed = client.start_step(step=2, replica_id=0, min_step=3, out=out)
    for name, grad in grads.items():
        streamed.push(name, grad)
    assert streamed.finish().pulled.global_step == 3
    assert plans[0] is plans[1] is streamed.plan  # one plan for the three steps, the streamed one included
    np.testing.assert_array_equal(out["w"], values["w"] - 3)
    # The appended min_step is the one the servers read: a pull for a step not reached yet waits, then times out
    # (one that ignored it would answer at once, with step 3).
    with pytest.raises(ParameterServerError) as err:
        client.pull(out=out, min_step=4, timeout=1.0)
    assert err.value.code == "DEADLINE_EXCEEDED", err.value
    assert client.pull(out=out, min_step=3).global_step == 3


def test_a_kept_plan_receives_into_its_assemblers_again_and_still_finds_a_missing_byte(ps: Servers) -> None:
    ps.start(1)
    client = ps.client()
    values = {"w": np.arange(6, dtype=np.float32), "b": np.ones(3, np.float32)}
    client.init("again", values, OptimizerConfig("sgd", 1.0))
    client.register(0)
    out = {"w": np.zeros(6, np.float32), "b": np.zeros(3, np.float32)}
    client.pull(out=out)
    [plan] = client._plans.values()
    first = plan.receiver(0)  # the last pull's assemblers, ready again
    assert plan.receiver(0).assemblers is not first.assemblers  # taken by a pull in progress: not shared
    client.push({"w": np.ones(6, np.float32), "b": np.ones(3, np.float32)}, step=0, replica_id=0)
    np.testing.assert_array_equal(client.pull(out=out).values["w"], values["w"] - 1)
    again = plan.receiver(0)
    with pytest.raises(ParameterServerError, match=re.escape("variable 'w' from shard 0 is incomplete: bytes [0, 24)")):
        again.finish()  # nothing arrived this time: the bytes of the last pull do not count


def test_a_scalar_variable_stays_a_scalar(ps: Servers) -> None:
    ps.start(1)
    client = ps.client()
    client.init("scalar", {"b": np.array(2.0, np.float32)}, OptimizerConfig("sgd", 1.0))
    client.register(0)
    assert client.layout["b"][0][1].shape == ()  # type: ignore[index]
    with pytest.raises(ParameterServerError, match=r"gradient for 'b' has shape \(1,\), the variable's is \(\)"):
        client.push({"b": np.ones(1, np.float32)}, step=0, replica_id=0)
    client.push({"b": np.array(0.5, np.float32)}, step=0, replica_id=0)
    pulled = client.pull().values["b"]
    assert pulled.shape == () and pulled == 1.5
