"""A NaN gradient in a job of several shards: the whole step is skipped or refused, on every shard alike.

Each shard checks the gradients it receives, but it sees only its own
variables. Before the replica said what it found, a NaN in a variable of shard
0 made shard 0 skip (or refuse) its part of the step while shard 1 applied its
part: half a step, with the job's event saying the step was skipped. These
tests failed on that code.
"""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from cellgraph.cluster.errors import ParameterServerError
from cellgraph.cluster.ps import OptimizerConfig, ParameterClient, TrainingConfig
from cellgraph.cluster.ps.auth import token_metadata
from cellgraph.protos import parameter_service_pb2 as pb
from cellgraph.protos import parameter_service_pb2_grpc as pb_grpc

from .conftest import TIMEOUT, Servers, status_of
from .test_waits import chunk

F32 = np.dtype(np.float32)
START = {"w": np.ones(2, F32), "v": np.full(2, 3.0, F32)}
NAN_IN_W = {"w": np.array([np.nan, 1.0], F32), "v": np.ones(2, F32)}
REASON = "replica 0's gradient for 'w' at step 0 holds 1 NaN and 0 Inf of 2 values"


def two_shards(ps: Servers, mode: str, nonfinite: str) -> ParameterClient:
    ps.start(2)
    client = ps.client()
    replicas = {"replicas_to_aggregate": 1} if mode == "sync" else {}
    client.init("j", START, OptimizerConfig("sgd", 0.5), TrainingConfig(mode, nonfinite=nonfinite, **replicas))  # type: ignore[arg-type]
    client.register(0)
    assert client.layout is not None
    shards = {name: {shard for shard, _ in pieces} for name, pieces in client.layout.items()}
    assert shards["w"] != shards["v"], f"the test needs w and v on different shards: {shards}"
    return client


def assert_unchanged(client: ParameterClient) -> None:
    values = client.pull().values
    for name, start in START.items():
        np.testing.assert_array_equal(values[name], start, err_msg=f"variable {name!r} changed")


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_skip_step_skips_every_shard(ps: Servers, mode: str) -> None:
    client = two_shards(ps, mode, "skip_step")
    pushed, _ = client.push_pull(NAN_IN_W, step=0, replica_id=0, min_step=1 if mode == "sync" else None)
    assert pushed.status == "skipped" and pushed.by_shard == ("skipped", "skipped")
    assert_unchanged(client)
    assert [s.steps_skipped for s in client.stats()] == [1, 1]
    assert {s.last_skipped for s in client.stats()} == {REASON}


def test_skip_step_of_a_streamed_step_skips_every_shard(ps: Servers) -> None:
    client = two_shards(ps, "sync", "skip_step")
    step = client.start_step(step=0, replica_id=0, min_step=1)
    step.push("v", NAN_IN_W["v"])  # shard of v: finite, and sent before the NaN is computed
    step.push("w", NAN_IN_W["w"])
    result = step.finish()
    assert result.pushed.status == "skipped" and result.pushed.by_shard == ("skipped", "skipped")
    np.testing.assert_array_equal(result.pulled.values["v"], START["v"])
    assert_unchanged(client)


def test_reject_refuses_on_every_shard_and_changes_nothing(ps: Servers) -> None:
    client = two_shards(ps, "async", "reject")
    with pytest.raises(ParameterServerError) as refused:
        client.push(NAN_IN_W, step=0, replica_id=0)
    assert REASON in str(refused.value) and "refuses non-finite gradients (nonfinite='reject'" in str(refused.value)
    assert_unchanged(client)
    # Neither shard applied its half (before: v's shard applied it). Each refuses what reaches it; but the
    # first refusal cancels the fan-out's other call, which may end before its shard has read the push (a
    # cancelled call is no refusal): once in a CI run, [2, 0].
    refused_by = [s.pushes_rejected for s in client.stats()]
    assert max(refused_by) >= 1, refused_by


def test_apply_applies_on_every_shard(ps: Servers) -> None:
    client = two_shards(ps, "async", "apply")
    pushed = client.push(NAN_IN_W, step=0, replica_id=0)
    assert pushed.status == "applied"
    values = client.pull().values
    assert np.isnan(values["w"][0]) and values["w"][1] == 0.5
    np.testing.assert_array_equal(values["v"], [2.5, 2.5])


def test_a_finite_push_applies_on_every_shard(ps: Servers) -> None:
    client = two_shards(ps, "async", "skip_step")
    pushed = client.push({"w": np.ones(2, F32), "v": np.ones(2, F32)}, step=0, replica_id=0)
    assert pushed.status == "applied"
    values = client.pull().values
    np.testing.assert_array_equal(values["w"], [0.5, 0.5])
    np.testing.assert_array_equal(values["v"], [2.5, 2.5])


def test_skip_step_of_a_variable_split_across_shards_skips_both_halves(ps: Servers) -> None:
    ps.start(2)
    client = ps.client()
    start = np.ones((4, 2), F32)
    client.init("j", {"m": start}, OptimizerConfig("sgd", 0.5), TrainingConfig("async", nonfinite="skip_step"))
    client.register(0)
    assert client.layout is not None and [shard for shard, _ in client.layout["m"]] == [0, 1]  # rows split
    grad = np.ones((4, 2), F32)
    grad[0, 0] = np.inf  # in shard 0's rows only
    pushed = client.push({"m": grad}, step=0, replica_id=0)
    assert pushed.by_shard == ("skipped", "skipped")
    np.testing.assert_array_equal(client.pull().values["m"], start)
    assert {s.last_skipped for s in client.stats()} == {
        "replica 0's gradient for 'm' at step 0 holds 0 NaN and 1 Inf of 8 values"
    }


@pytest.mark.parametrize("checked", [False, True])
def test_a_shard_leaves_the_check_to_a_replica_that_says_it_checks(ps: Servers, checked: bool) -> None:
    """``PushHeader.checked``: the replica checks every gradient of the push itself and names what it found on
    the last message, so the shard does not check them again (one pass over the bytes, not two). A push that
    does not say so is checked by the shard, as before."""
    [address] = ps.start(1)
    client = ps.client()
    client.init("j", {"w": np.ones(2, F32)}, OptimizerConfig("sgd", 0.5), TrainingConfig("async"))
    client.register(0)
    nan = chunk("w", (2,), 0, np.array([np.nan, 1.0], F32).tobytes())
    request = pb.StepRequest(header=pb.PushHeader(replica_id=0, step=0, checked=checked), chunks=[nan])
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.ParameterServiceStub(channel)
        if checked:  # taken at its word: no NaN was named
            [answer] = list(stub.Step(iter([request]), timeout=TIMEOUT, metadata=token_metadata(ps.token)))
            assert answer.push.status == pb.PushResponse.APPLIED
        else:
            err = status_of(
                lambda: list(stub.Step(iter([request]), timeout=TIMEOUT, metadata=token_metadata(ps.token)))
            )
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "replica 0's gradient for 'w' at step 0 holds 1 NaN and 0 Inf of 2 values" in (err.details() or "")
