"""A replica's step hands each gradient over the moment backprop computes it (issue 15, overlap)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from cellgraph.cluster.ps import TrainingConfig
from cellgraph.cluster.ps.streaming import StreamedStep
from cellgraph.cluster.replica import METRIC_KEYS, ReplicaSpec, run_replica
from cellgraph.cluster.training_graph import LoadedGraph, load, prepare
from cellgraph.examples import models

from .test_replica import TIMEOUT, linear_problem, ps_job


def test_each_gradient_is_handed_over_as_computed_with_the_values_returned() -> None:
    model = models.mlp()
    loaded = load(prepare(model.loss))
    rng = np.random.default_rng(0)
    values = {name: (0.1 * rng.normal(size=t.shape)).astype(t.dtype) for name, t in zip(loaded.names, loaded.variables)}
    batch = [rng.normal(size=(8, 64)).astype(np.float32), rng.integers(0, 10, size=8).astype(np.int32)]
    seen: list[tuple[str, np.ndarray]] = []
    loss, grads = loaded.compute(values, batch, on_gradient=lambda name, g: seen.append((name, g.copy())))
    plain_loss, plain = loaded.compute(values, batch)
    assert loss == plain_loss
    assert sorted(name for name, _ in seen) == sorted(grads) == sorted(values)
    for name, grad in seen:
        np.testing.assert_array_equal(grad, grads[name])
        np.testing.assert_array_equal(grad, plain[name])
    # Backprop order: the output layer's gradients are ready before the first layer's.
    order = [name for name, _ in seen]
    first_layer = [i for i, name in enumerate(order) if name.startswith("hidden")]
    last_layer = [i for i, name in enumerate(order) if name.startswith("logits")]
    assert first_layer and last_layer and max(last_layer) < min(first_layer), order


def test_a_replica_reports_the_share_of_communication_hidden_behind_compute() -> None:
    loss, data, _ = linear_problem()
    tg = prepare(loss)
    messages: list[dict[str, object]] = []
    with ps_job(tg, training=TrainingConfig("async")) as (addrs, token, _):
        spec = ReplicaSpec(
            "job", 0, tg, addrs, token, mode="async", batch_size=16, steps=20, timeout_s=TIMEOUT, metrics_interval_s=0.0
        )
        summary = run_replica(spec, data, emit=messages.append)
    assert summary["global_step"] == 20
    assert "overlap_fraction" in METRIC_KEYS
    assert messages and all(0.0 <= float(m["overlap_fraction"]) <= 1.0 for m in messages)  # type: ignore[arg-type]


def test_a_step_that_stops_with_any_exception_gives_its_streams_back(monkeypatch: pytest.MonkeyPatch) -> None:
    loss, data, _ = linear_problem()
    tg = prepare(loss)
    aborted: list[int] = []
    abort = StreamedStep.abort

    def counted(self: StreamedStep) -> None:
        aborted.append(self.step)
        abort(self)

    compute = LoadedGraph.compute

    def interrupted(self: LoadedGraph, values: Any, batch: Any, on_gradient: Any = None, wait: Any = None) -> Any:
        if on_gradient is None:  # the replica's warm-up step, before it joins
            return compute(self, values, batch)
        on_gradient("b", np.float32(0.0).reshape(()))  # the step takes its streams at its first gradient
        raise KeyboardInterrupt  # not a CellgraphError: the step's streams must be given back all the same

    monkeypatch.setattr(StreamedStep, "abort", counted)
    monkeypatch.setattr(LoadedGraph, "compute", interrupted)
    with ps_job(tg, training=TrainingConfig("async")) as (addrs, token, _):
        spec = ReplicaSpec("job", 0, tg, addrs, token, mode="async", batch_size=16, steps=5, timeout_s=TIMEOUT)
        with pytest.raises(KeyboardInterrupt):
            run_replica(spec, data)
    assert aborted == [0]
