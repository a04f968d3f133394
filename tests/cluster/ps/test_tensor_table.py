"""A shard's small variables updated as one group (cluster/ps/tensor_table.py).

What must hold: a grouped shard trains bit for bit as each variable trained alone does (every optimizer,
sync and async, a gradient that arrived fused or not), copy on write still protects every reader, a group
whose step counts disagree (a checkpoint's) is updated member by member, and a replica's streamed step
sends its small gradients in the shard's order, so the store takes them whole.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from cellgraph.cluster.ps import ParameterClient, create_server, fused
from cellgraph.cluster.ps.config import OptimizerConfig, TrainingConfig, VariableSpec
from cellgraph.cluster.ps.shard_layout import ShardLayout
from cellgraph.cluster.ps.store import ParameterStore, StoreState
from cellgraph.cluster.ps.tensor_table import TensorTable, tensor_groups
from cellgraph.dataflow.optimizer_registry import kinds

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
SHAPES = {"w": (3, 4), "b": (4,), "s": ()}
TIMEOUT = 30.0


def specs(dtype: np.dtype) -> list[VariableSpec]:
    return [VariableSpec(name, dtype, shape) for name, shape in SHAPES.items()]


def config(kind: str) -> OptimizerConfig:
    return OptimizerConfig(kind, learning_rate=0.05)  # type: ignore[arg-type]


def trained(
    kind: str, mode: str, dtype: np.dtype, names: list[str], with_fused: bool, steps: int = 5
) -> ParameterStore:
    """A store of ``names`` trained ``steps`` steps by two replicas on fixed random gradients."""
    rng = np.random.default_rng(3)
    initial = {name: rng.normal(size=shape).astype(dtype) for name, shape in SHAPES.items()}
    gradients = [
        [{name: rng.normal(size=shape).astype(dtype) for name, shape in SHAPES.items()} for _ in range(2)]
        for _ in range(steps)
    ]
    k = 2 if mode == "sync" else 1
    shard = [VariableSpec(name, dtype, SHAPES[name]) for name in names]  # in the order of ``names``
    store = ParameterStore("j", shard, {n: initial[n] for n in names}, config(kind), TrainingConfig(mode, k))  # type: ignore[arg-type]
    for replica in (0, 1):
        store.register(replica)
    for step, per_replica in enumerate(gradients):
        for replica, grads in enumerate(per_replica):
            pushed = {n: grads[n] for n in names}
            flat = {tuple(names): np.concatenate([pushed[n].reshape(-1) for n in names])} if with_fused else None
            store.push(replica, step if mode == "sync" else store.global_step, pushed, fused=flat)
    return store


@pytest.mark.parametrize("names", [["w", "b", "s"], ["s", "w", "b"]], ids=["scalar-last", "scalar-first"])
@pytest.mark.parametrize("with_fused", [False, True], ids=["per-member", "arrived-fused"])
@pytest.mark.parametrize("dtype", [F32, F64], ids=["float32", "float64"])
@pytest.mark.parametrize("kind", kinds())
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_grouped_shard_trains_bit_for_bit_as_each_variable_alone(
    mode: str, kind: str, dtype: np.dtype, with_fused: bool, names: list[str]
) -> None:
    # A scalar variable first: its slots are scalars too, but Adam's m and v are still elementwise.
    shard = [VariableSpec(name, dtype, SHAPES[name]) for name in names]
    assert [group.names for group in tensor_groups(ShardLayout(shard, kind))] == [tuple(names)]
    grouped = trained(kind, mode, dtype, names, with_fused).state()
    for name in names:
        alone = trained(kind, mode, dtype, [name], with_fused=False).state()
        assert alone.versions[name] == grouped.versions[name] == (5 if mode == "sync" else 10)
        for key, value in alone.tensors.items():
            np.testing.assert_array_equal(grouped.tensors[key], value, err_msg=key)


def test_which_variables_are_grouped() -> None:
    big = fused.FUSE_TENSOR_BYTES // 4 + 1
    many = fused.FUSE_GROUP_BYTES // (4 * 1000)  # float32 tensors of 1,000 values: more than one group holds
    shard = [
        VariableSpec("a", F32, (3,)),
        VariableSpec("x", F64, (2,)),
        VariableSpec("big", F32, (big,)),  # too big to travel fused: alone
        VariableSpec("mean", F32, (3,), moving=True, momentum=0.9),  # a moving statistic: never grouped
        VariableSpec("b", F32, ()),
        VariableSpec("y", F64, (2, 2)),
        VariableSpec("lone", F64, (0,)),  # empty: nothing to join
        *(VariableSpec(f"m{i}", F32, (1000,)) for i in range(many + 2)),
    ]
    groups = [(group.names, group.dtype) for group in tensor_groups(ShardLayout(shard, "adam"))]
    assert groups == [
        (("a", "b", *(f"m{i}" for i in range(many))), F32),  # 16 bytes and `many` of 4,000: at most 1 MiB
        (("x", "y"), F64),
        ((f"m{many}", f"m{many + 1}"), F32),
    ]


def test_a_reader_keeps_its_values_while_its_group_is_updated() -> None:
    store = ParameterStore(
        "j", specs(F32), {n: np.ones(s, F32) for n, s in SHAPES.items()}, config("sgd"), TrainingConfig()
    )
    store.register(0)
    ones = {n: np.ones(s, F32) for n, s in SHAPES.items()}
    held = store.read(["b"])[1]["b"][1]  # one member held: its whole group is copied by the update
    assert not held.flags.writeable
    store.push(0, 0, ones)
    np.testing.assert_array_equal(held, np.ones(4, F32))
    after = store.read()[1]
    for name in SHAPES:
        np.testing.assert_array_equal(after[name][1], np.full(SHAPES[name], 0.95, F32))
    # A view cut from a held one (the bytes a pull sends) keeps the reader's buffer apart too.
    sent = np.ascontiguousarray(after["w"][1]).reshape(-1).view(np.uint8)
    del after
    store.push(0, 1, ones)
    np.testing.assert_array_equal(sent.view(F32), np.full(12, 0.95, F32))
    del held, sent
    address = store.read(["w"])[1]["w"][1].__array_interface__["data"][0]
    store.push(0, 2, ones)  # nobody reads now: in place
    again = store.read(["w"])[1]["w"][1]
    assert again.__array_interface__["data"][0] == address
    np.testing.assert_allclose(again, np.full((3, 4), 0.85, F32), rtol=1e-6)


def test_a_group_whose_step_counts_differ_is_updated_member_by_member() -> None:
    # Adam's step count is one value per variable: a checkpoint may hold different ones (written by other code,
    # or edited); the group cannot advance them as one, and each member must go on from its own.
    def loaded(names: list[str]) -> ParameterStore:
        store = ParameterStore(
            "j",
            [s for s in specs(F64) if s.name in names],
            {n: np.ones(SHAPES[n]) for n in names},
            config("adam"),
            TrainingConfig(),
        )
        tensors: dict[str, np.ndarray] = {}
        for name in names:
            count = {"w": 3.0, "b": 7.0, "s": 3.0}[name]
            tensors |= {name: np.full(SHAPES[name], 0.5), f"{name}/m": np.full(SHAPES[name], 0.1)}
            tensors |= {f"{name}/v": np.full(SHAPES[name], 0.2), f"{name}/t": np.array(count)}
        store.load_state(StoreState(10, dict.fromkeys(names, 10), tensors))
        store.register(0)
        store.push(0, 10, {n: np.full(SHAPES[n], 0.3) for n in names})
        return store

    names = list(SHAPES)
    together = loaded(names).state()
    assert together.tensors["w/t"] == 4.0 and together.tensors["b/t"] == 8.0
    for name in names:
        alone = loaded([name]).state()
        for key, value in alone.tensors.items():
            np.testing.assert_array_equal(together.tensors[key], value, err_msg=key)


def test_a_streamed_step_sends_its_small_gradients_in_the_shards_order(monkeypatch: pytest.MonkeyPatch) -> None:
    # Backprop hands the gradients over last layer first; the store holds the small ones in the shard's order,
    # and takes a fused chunk whole only when its members come in that order.
    seen: list[Any] = []
    push = ParameterStore.push

    def recording(self: ParameterStore, replica: int, step: int, grads: Any, *rest: Any) -> Any:
        seen.append(sorted(rest[2] or {}))  # (finite, reported, fused)
        return push(self, replica, step, grads, *rest)

    monkeypatch.setattr(ParameterStore, "push", recording)
    server, port = create_server("127.0.0.1:0", token="t")
    try:
        with ParameterClient([f"127.0.0.1:{port}"], token="t", timeout=TIMEOUT) as client:
            values = {name: np.zeros(shape, F32) for name, shape in SHAPES.items()}
            client.init("order", values, OptimizerConfig("sgd", 1.0))
            client.register(0)
            step = client.start_step(step=0, replica_id=0)
            for name in reversed(list(values)):
                step.push(name, np.ones(SHAPES[name], F32))
            result = step.finish()
        assert result.pushed.status == "applied"
        for name in values:
            np.testing.assert_array_equal(result.pulled.values[name], np.full(SHAPES[name], -1.0, F32))
    finally:
        server.stop(None).wait(TIMEOUT)
    assert seen == [[tuple(SHAPES)]]


def test_a_restore_copies_the_checkpoint_before_it_takes_the_stores_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    # A big shard's copy takes a while: pushes and pulls (the server's loop, health checks behind it) must not
    # wait for it; only the swap holds the lock.
    store = ParameterStore(
        "j", specs(F32), {n: np.ones(s, F32) for n, s in SHAPES.items()}, config("sgd"), TrainingConfig()
    )
    state = StoreState(5, dict.fromkeys(SHAPES, 5), {n: np.full(s, 2.0, F32) for n, s in SHAPES.items()})
    copying, finish = threading.Event(), threading.Event()
    prepare = TensorTable.prepare

    def slow_copy(self: TensorTable, values: Any) -> Any:
        copying.set()
        assert finish.wait(TIMEOUT)
        return prepare(self, values)

    monkeypatch.setattr(TensorTable, "prepare", slow_copy)
    with ThreadPoolExecutor(2) as pool:
        restoring = pool.submit(store.load_state, state)
        assert copying.wait(TIMEOUT)
        step, values = pool.submit(store.read, ["w"]).result(TIMEOUT)  # answered during the copy
        assert step == 0 and values["w"][1][0, 0] == 1.0
        finish.set()
        restoring.result(TIMEOUT)
    assert store.read(["w"])[0] == 5 and store.read(["w"])[1]["w"][1][0, 0] == 2.0
