"""Values cross the wire as values: a big-endian array's numbers, a bfloat16 array's clear refusal.

Both failed before: the chunks carried an array's raw bytes labelled with its
dtype's name, so a big-endian float32 array (``>f4``, as files written on
other machines hold them) arrived as little-endian garbage with no error; and
a bfloat16 array's chunk header was made from ``dtype.str`` (a bare ``V2``),
so its Init failed inside gRPC's request iterator with "Exception iterating
requests!" instead of the server's words.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from cellgraph.cluster.errors import ParameterServerError
from cellgraph.cluster.ps import OptimizerConfig, TrainingConfig
from cellgraph.cluster.ps.chunks import byte_view

from .conftest import Servers


def test_byte_view_gives_little_endian_bytes_of_the_values() -> None:
    values = np.array([1.5, -2.0, 3e38], np.float32)
    assert byte_view(values.astype(">f4")).tobytes() == values.astype("<f4").tobytes()
    native = np.arange(4, dtype=np.float32)
    view = byte_view(native)
    view[:4] = 0  # a view, not a copy: receivers write chunks into it in place
    assert native[0] == 0.0


def test_big_endian_values_and_gradients_arrive_as_their_values(ps: Servers) -> None:
    ps.start(2)
    client = ps.client()
    start = {"w": np.array([1.0, 2.0, 3.0], ">f4"), "m": np.arange(8, dtype=">f8").reshape(4, 2)}
    client.init("j", start, OptimizerConfig("sgd", 0.5), TrainingConfig("async"))
    client.register(0)
    pulled = client.pull().values
    np.testing.assert_array_equal(pulled["w"], [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(pulled["m"], np.arange(8.0).reshape(4, 2))
    client.push({"w": np.ones(3, ">f4"), "m": np.full((4, 2), 2.0, ">f8")}, step=0, replica_id=0)
    pulled = client.pull().values
    np.testing.assert_array_equal(pulled["w"], [0.5, 1.5, 2.5])
    np.testing.assert_array_equal(pulled["m"], np.arange(8.0).reshape(4, 2) - 1.0)


def test_a_bfloat16_variable_is_refused_in_the_servers_words(ps: Servers) -> None:
    ps.start(1)
    client = ps.client()
    with pytest.raises(ParameterServerError) as refused:
        client.init("j", {"w": np.ones(3, ml_dtypes.bfloat16)}, OptimizerConfig("sgd", 0.5), TrainingConfig("async"))
    assert "variable 'w' has dtype bfloat16; a parameter server trains only float32 or float64" in str(refused.value)
