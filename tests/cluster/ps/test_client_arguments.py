"""ParameterClient refuses an out-of-range replica id or step at its public methods, naming the argument and
its range, before anything is sent (protobuf raised a bare ValueError naming neither)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from cellgraph.cluster.ps import OptimizerConfig, ParameterClient

from .conftest import Servers

G = {"w": np.ones(2, np.float32)}
CALLS: list[tuple[Callable[[ParameterClient], Any], str]] = [
    (
        lambda c: c.register(2**62),
        r"replica_id 4611686018427387904 is out of range: it must be an int in \[0, 2147483647\]",
    ),
    (lambda c: c.register(-1), r"replica_id -1 is out of range"),
    (lambda c: c.pull(replica_id=2**31), r"replica_id 2147483648 is out of range"),
    (
        lambda c: c.pull(min_step=2**63),
        r"min_step 9223372036854775808 is out of range: it must be an int in \[0, 9223372036854775807\]",
    ),
    (lambda c: c.push(G, step=-1, replica_id=0), r"step -1 is out of range"),
    (lambda c: c.push(G, step=0, replica_id=2**40), r"replica_id 1099511627776 is out of range"),
    (lambda c: c.push_pull(G, step=2**64, replica_id=0), r"step 18446744073709551616 is out of range"),
    (lambda c: c.push_pull(G, step=0, replica_id=0, min_step=-5), r"min_step -5 is out of range"),
    (lambda c: c.start_step(step=0, replica_id=2**31), r"replica_id 2147483648 is out of range"),
    (lambda c: c.start_step(step=1.5, replica_id=0), r"step 1.5 is out of range: it must be an int"),
]


@pytest.mark.parametrize("call, words", CALLS)
def test_an_out_of_range_argument_is_refused_by_name_and_nothing_changes(ps: Servers, call, words) -> None:  # type: ignore[no-untyped-def]
    ps.start()
    client = ps.client()
    client.init("j", {"w": np.zeros(2, np.float32)}, OptimizerConfig("sgd", learning_rate=1.0))
    client.register(0)
    with pytest.raises(ValueError, match=words):
        call(client)
    pulled = client.pull()
    assert pulled.global_step == 0
    np.testing.assert_array_equal(pulled.values["w"], np.zeros(2, np.float32))
