"""Where a pull writes (cluster/ps/destinations.py): new arrays side by side as a shard's fused answer carries
them, received in one copy; the caller's own arrays, wherever they lie, received member by member."""

from __future__ import annotations

import numpy as np
import pytest

from cellgraph.cluster.errors import ParameterServerError
from cellgraph.cluster.ps import OptimizerConfig, VariableSpec, fused
from cellgraph.cluster.ps.destinations import destinations, span
from cellgraph.cluster.ps.frames import Framed
from cellgraph.cluster.ps.held import PullPlan
from cellgraph.cluster.ps.step_server import _answer_frames
from cellgraph.cluster.ps.streaming import Arrivals
from cellgraph.protos import parameter_service_pb2 as pb

from .conftest import Servers

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)


def layout() -> dict[str, list[tuple[int, VariableSpec]]]:
    """Two shards; float32 and float64 variables on shard 0, one on shard 1, and one split over both."""
    return {
        "a": [(0, VariableSpec("a", F32, (2, 3)))],
        "x": [(0, VariableSpec("x", F64, (2,)))],
        "b": [(0, VariableSpec("b", F32, (4,)))],
        "c": [(1, VariableSpec("c", F32, (5,)))],
        "s": [
            (0, VariableSpec("s", F32, (2, 2), full_shape=(4, 2), rows=(0, 2))),
            (1, VariableSpec("s", F32, (2, 2), full_shape=(4, 2), rows=(2, 4))),
        ],
    }


def test_new_arrays_lie_side_by_side_by_shard_and_dtype_in_the_pulls_order() -> None:
    arrays = destinations(layout(), ["a", "x", "b", "c", "s"], None)
    assert list(arrays) == ["a", "x", "b", "c", "s"]
    assert {name: a.shape for name, a in arrays.items()} == {"a": (2, 3), "x": (2,), "b": (4,), "c": (5,), "s": (4, 2)}
    assert all(a.flags.writeable and a.flags.c_contiguous for a in arrays.values())
    whole = span([arrays["a"], arrays["b"]], F32)  # shard 0's float32 ones, x (float64) apart
    assert whole is not None and whole.size == 10
    whole[:] = np.arange(10)
    np.testing.assert_array_equal(arrays["b"], [6, 7, 8, 9])
    assert arrays["x"].base is None  # alone in its group (float64): an array of its own
    # Another shard's, another dtype's, a split variable's, or the order reversed: not one span.
    assert span([arrays["b"], arrays["c"]], F32) is None
    assert span([arrays["a"], arrays["x"]], F32) is None
    assert span([arrays["s"]], F32) is None
    assert span([arrays["b"], arrays["a"]], F32) is None
    assert span([], F32) is None and span([None], F32) is None


def test_new_arrays_share_a_buffer_only_with_the_members_of_their_fused_group() -> None:
    # As a shard's answer groups them: a big variable alone, and small ones in groups of at most FUSE_GROUP_BYTES,
    # so that a value kept on its own holds at most its group's buffer, not the shard's.
    small = fused.FUSE_TENSOR_BYTES // 4  # float32 elements of the biggest tensor that fuses
    shapes = {"s1": (small,), "big": (small + 1,), "s2": (small,), "s3": (small,), "s4": (small,), "s5": (small,)}
    plan = {name: [(0, VariableSpec(name, F32, shape))] for name, shape in shapes.items()}
    arrays = destinations(plan, list(shapes), None)
    assert arrays["big"].base is None
    group_bytes = [base.nbytes for base in {id(a.base): a.base for a in arrays.values() if a.base is not None}.values()]
    assert max(group_bytes) <= fused.FUSE_GROUP_BYTES
    assert span([arrays["s2"], arrays["s3"], arrays["s4"], arrays["s5"]], F32) is not None  # 1 MiB: one group
    assert span([arrays["s1"], arrays["s2"]], F32) is None  # the big one between them: two groups
    values = {name: (1, np.full(shape, i, F32)) for i, (name, shape) in enumerate(shapes.items())}
    groups = [[name for name, _ in members] for _, members in fused.answer_groups(values, 1 << 22)]
    assert groups == [["s1"], ["big"], ["s2", "s3", "s4", "s5"]]


def test_the_callers_arrays_are_used_as_they_are_and_checked() -> None:
    mine = np.zeros((2, 3), F32)
    arrays = destinations(layout(), ["a", "b"], {"a": mine})
    assert arrays["a"] is mine and arrays["b"].shape == (4,)
    assert span([arrays["a"], arrays["b"]], F32) is None  # not from one buffer
    with pytest.raises(ParameterServerError, match=r"pull\(out=...\): out\['a'\] is a read-only float32 array"):
        frozen = np.zeros((2, 3), F32)
        frozen.flags.writeable = False
        destinations(layout(), ["a"], {"a": frozen})
    with pytest.raises(ParameterServerError, match=r"out\['b'\] is a float64 array of shape \(4,\); it must be"):
        destinations(layout(), ["b"], {"b": np.zeros(4)})


@pytest.mark.parametrize("side_by_side", [True, False], ids=["new-arrays", "callers-arrays"])
def test_a_fused_answer_lands_whole_and_each_variable_is_reported_once(side_by_side: bool) -> None:
    specs = {name: pieces[0][1] for name, pieces in layout().items() if name in "axb"}
    out = None if side_by_side else {name: np.full(spec.shape, -1, spec.dtype) for name, spec in specs.items()}
    plan = PullPlan({name: layout()[name] for name in specs}, list(specs), 0, 1 << 20, out)
    rng = np.random.default_rng(0)
    for version in (1, 2):  # the second answer is received by the kept plan's assemblers again
        sent = {name: (version, rng.standard_normal(spec.shape).astype(spec.dtype)) for name, spec in specs.items()}
        [frame] = _answer_frames(None, version, sent, 1 << 20, fuse=True)
        told: list[str] = []
        receiver = plan.receiver(0, told.extend)
        values = list(pb.StepResponse.FromString(frame).values)
        assert sorted(len(v.chunk.members) for v in values) == [0, 2]  # a and b fused; x alone (float64)
        receiver.add(Framed(values, [memoryview(v.chunk.content) for v in values]), values)
        assert receiver.finish() == (version, dict.fromkeys(specs, version))
        assert sorted(told) == sorted(specs)
        for name, (_, value) in sent.items():
            np.testing.assert_array_equal(plan.whole[name], value)
    assert (plan._spans[0][("a", "b")] is not None) == side_by_side


def test_arrivals_wake_a_waiter_once_every_shards_piece_is_in() -> None:
    plan = PullPlan(layout(), ["a", "s", "c"], 0, 1 << 20, None)
    arrivals = Arrivals(plan)
    arrivals.pieces(0, ["a", "s"])
    assert arrivals.wait("a", deadline=0.0)  # whole: no wait
    assert not arrivals.wait("s", deadline=0.0)  # shard 1's rows still owed
    arrivals.pieces(1, ["s", "s", "c"])  # told twice: counted once
    assert arrivals.wait("s", deadline=0.0) and arrivals.wait("c", deadline=0.0)


def test_a_replica_pulling_into_its_first_pulls_arrays_trains_as_numpy_does(ps: Servers) -> None:
    ps.start(1)
    client = ps.client()
    values = {"w": np.arange(6, dtype=F32).reshape(2, 3), "b": np.ones(3, F32), "v": np.zeros(2, F64)}
    client.init("kept", values, OptimizerConfig("sgd", 0.5))
    client.register(0)
    held = dict(client.pull().values)  # the replica's arrays, side by side, pulled into step after step
    assert span([held["w"], held["b"]], F32) is not None
    expected = {name: value.copy() for name, value in values.items()}
    for step in range(3):
        grads = {name: np.full_like(value, step + 1) for name, value in values.items()}
        streamed = client.start_step(step=step, replica_id=0, out=held)
        for name, grad in grads.items():
            streamed.push(name, grad)
        result = streamed.finish()
        for name in values:
            expected[name] = expected[name] - expected[name].dtype.type(0.5) * grads[name]
            assert result.pulled.values[name] is held[name]
            np.testing.assert_array_equal(held[name], expected[name])
