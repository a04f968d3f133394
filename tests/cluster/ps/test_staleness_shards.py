"""An async staleness bound over several servers is refused: each would judge a push by its own global step.

Two replicas pull at step 0; server 0 sees replica 0's push first, server 1
replica 1's. With ``max_staleness=0`` server 0 applies replica 0's push and
drops replica 1's, server 1 the other way round: two half steps, and each
replica is told only "stale". Before the refusal, ``init`` took such a job and
a push reached exactly that state (``a`` moved by one replica's gradient,
``b`` by the other's).
"""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from cellgraph.cluster.errors import ParameterServerError
from cellgraph.cluster.ps.config import OptimizerConfig, TrainingConfig
from cellgraph.protos import parameter_service_pb2 as pb

from .conftest import Servers
from .test_limits import init_chunk, job, refused, spec

INIT = {"a": np.zeros((4, 2)), "b": np.zeros(8)}
WORDS = (
    "Init of job 'bound': max_staleness=0 in async mode needs every variable on one parameter server, but the "
    "job's variables are on 2: each server judges a push's staleness by its own global step, so one could apply "
    "a push that another drops as stale (half a step, silently)."
)


def test_a_staleness_bound_over_two_servers_is_refused_before_any_server_hears_of_it(ps: Servers) -> None:
    ps.start(2)
    client = ps.client()
    bound = TrainingConfig("async", max_staleness=0)
    with pytest.raises(ParameterServerError, match="max_staleness") as refused:
        client.init("bound", INIT, OptimizerConfig("sgd", 1.0), bound, split_threshold=10**6)
    assert WORDS in str(refused.value)
    assert refused.value.code == "INVALID_ARGUMENT"
    assert client.layout is None
    # No server was given the job: the same job with other rules is a first Init, not a conflicting second one.
    assert client.init("bound", INIT, OptimizerConfig("sgd", 1.0), TrainingConfig("async"), split_threshold=10**6) == 0
    assert sorted({shard for pieces in client.layout.values() for shard, _ in pieces}) == [0, 1]  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "training",
    [TrainingConfig("async"), TrainingConfig("sync", replicas_to_aggregate=2)],
    ids=["async without a bound", "sync"],
)
def test_without_a_bound_or_in_sync_mode_two_servers_apply_every_push_whole(
    ps: Servers, training: TrainingConfig
) -> None:
    ps.start(2)
    client = ps.client()
    client.init("whole", INIT, OptimizerConfig("sgd", 1.0), training, split_threshold=10**6)
    for replica in (0, 1):
        client.register(replica)
    for replica in (0, 1):
        client.push({"a": np.full((4, 2), replica + 1.0), "b": np.full(8, replica + 1.0)}, step=0, replica_id=replica)
    values = client.pull(min_step=1).values
    moved = 3.0 if training.mode == "async" else 1.5  # both gradients (sum), or their mean
    np.testing.assert_array_equal(values["a"], np.full((4, 2), -moved))
    np.testing.assert_array_equal(values["b"], np.full(8, -moved))


def test_a_staleness_bound_on_one_server_still_drops_a_stale_push_whole(ps: Servers) -> None:
    ps.start(1)
    client = ps.client()
    client.init("one", INIT, OptimizerConfig("sgd", 1.0), TrainingConfig("async", max_staleness=0))
    for replica in (0, 1):
        client.register(replica)
    first = client.push({"a": np.ones((4, 2)), "b": np.ones(8)}, step=0, replica_id=0)
    second = client.push({"a": np.ones((4, 2)), "b": np.ones(8)}, step=0, replica_id=1)
    assert (first.status, second.status, second.staleness) == ("applied", "stale", 1)
    values = client.pull().values
    np.testing.assert_array_equal(values["a"], -np.ones((4, 2)))
    np.testing.assert_array_equal(values["b"], -np.ones(8))


def test_the_server_refuses_a_bound_over_two_shards_from_a_client_of_its_own(ps: Servers) -> None:
    """The door checks it too: a client that is not ``ParameterClient`` gets the same words, and no job."""
    ps.start(1)
    mine = pb.ShardMapEntry(shard=0, variable=spec(2, 4))
    theirs = pb.ShardMapEntry(shard=1, variable=spec(3, name="b"))
    config = job(
        training=pb.TrainingConfigProto(mode=pb.ASYNC, replicas_to_aggregate=1, max_staleness=0),
    )
    config.config.num_shards = 2
    config.config.shard_map.extend([mine, theirs])
    err = refused(ps, [config, init_chunk()])
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details().startswith(
        "job 'k': max_staleness=0 in async mode needs every variable on one parameter server, but the job's "
        "variables are on 2:"
    ), err.details()
