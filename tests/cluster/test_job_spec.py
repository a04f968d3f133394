"""``cg.train`` checks everything before anything starts: every argument, and each feed's graph, shape and dtype."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import cellgraph as cg
from cellgraph.cluster.cluster import Cluster
from cellgraph.cluster.job_spec import JobSpec
from cellgraph.cluster.training_graph import TrainingError
from cellgraph.dataflow.errors import CellgraphError
from cellgraph.examples import digits, models


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with Cluster.local(workers=2, ps=1) as local:
        yield local


def refused(cluster: Cluster, loss: cg.Tensor, data: Any, **kwargs: Any) -> str:
    """The message of the ``TrainingError`` that ``cg.train`` raises, after checking that nothing started."""
    with pytest.raises(TrainingError) as err:
        cg.train(loss, data, cluster=cluster, **kwargs)
    assert cluster._jobs == {}
    return str(err.value)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        (dict(replicas=0), "replicas must be an int of at least 1, got 0"),
        (dict(replicas=True), "replicas must be an int of at least 1, got True"),
        (dict(replicas=3), "3 replicas need 3 training workers and the cluster has 2: pass replicas=2"),
        (dict(batch_size=0), "batch_size must be an int of at least 1, got 0"),
        (dict(batch_size=2.5), "batch_size must be an int of at least 1, got 2.5"),
        (dict(batch_size=10_000), "batch_size 10000 is larger than a replica's shard (719 rows: 1438 over 2"),
        (dict(steps=-1), "steps must be an int, 0 or more, got -1"),
        (dict(mode="fast"), "mode must be 'sync' or 'async', got 'fast'"),
        (dict(replicas_to_aggregate=3), "replicas_to_aggregate must be between 1 and replicas (2), got 3"),
        (dict(mode="async", replicas_to_aggregate=1), "replicas_to_aggregate is for mode='sync' (async mode applies"),
        (dict(max_staleness=-2), "max_staleness must be an int, 0 or more (or None: no bound), got -2"),
        (dict(checkpoint_every=0), "checkpoint_every must be an int of at least 1 (or None), got 0"),
        (dict(checkpoint_dir=42), "checkpoint_dir must be a path (str or pathlib.Path) or None, got int"),
        (dict(resume_from="ckpt-0000000100"), "resume_from='ckpt-0000000100' needs checkpoint_dir, the folder"),
        (dict(resume_from=""), "resume_from must be a checkpoint's name (e.g. 'ckpt-0000000300') or None, got ''"),
        (dict(nonfinite="ignore"), "nonfinite must be one of 'reject', 'skip_step', 'apply', got 'ignore'"),
        (dict(seed=-1), "seed must be an int, 0 or more, got -1"),
        (dict(metrics_interval_s=float("nan")), "metrics_interval_s must be a finite number of seconds, 0 or more"),
        (dict(timeout_s=0), "timeout_s must be a finite, positive number of seconds, got 0"),
        (dict(optimizer="adam"), "optimizer 'adam' is not one the parameter servers run: use cg.optim.SGD"),
        (
            dict(optimizer=cg.optim.mixed_precision(cg.optim.Adam(1e-3))),
            "mixed precision runs in a local Session only (the parameter servers apply plain optimizers and keep "
            "no loss scale); on a cluster, pass a plain one (its own: Adam(",
        ),
    ],
)
def test_each_bad_argument_is_named_before_anything_starts(
    cluster: Cluster, data: digits.Split, kwargs: dict[str, Any], words: str
) -> None:
    model = models.mlp()
    message = refused(cluster, model.loss, (data.x_train, data.y_train), **kwargs)
    assert message.startswith("cg.train: ") and words in message, message


def test_every_bad_argument_is_named_in_one_message(cluster: Cluster, data: digits.Split) -> None:
    model = models.mlp()
    message = refused(cluster, model.loss, (data.x_train, data.y_train), replicas=0, steps=-5, timeout_s=-1.0)
    assert "replicas must be an int of at least 1, got 0; steps must be an int, 0 or more, got -5; " in message
    assert "timeout_s must be a finite, positive number of seconds, got -1.0" in message


def test_checkpoint_arguments_are_checked_against_the_folder(
    cluster: Cluster, data: digits.Split, tmp_path: Path
) -> None:
    model = models.mlp()
    xy = (data.x_train, data.y_train)
    (tmp_path / "ckpt-0000000040").mkdir()
    message = refused(cluster, model.loss, xy, checkpoint_dir=tmp_path, resume_from="ckpt-0000000080")
    assert f"resume_from 'ckpt-0000000080' is not in checkpoint_dir '{tmp_path}' (it holds ckpt-0000000040)" in message
    # A new job in a folder that holds another job's checkpoints: before, it wrote its own over them at the same
    # steps (a mix that export refused), and an export of the folder read the old job's newer step without a word.
    assert refused(cluster, model.loss, xy, checkpoint_dir=tmp_path) == (
        f"cg.train: checkpoint_dir '{tmp_path}' already holds checkpoints of another job (ckpt-0000000040): a new job "
        "would write its own over those of the same steps, and cg.save_model or cg.onnx.export of the folder would "
        "read whichever job wrote the newest; pass resume_from='ckpt-0000000040' to go on from that job's newest, or "
        "give the new job a folder of its own (an empty or new one, or none: a temporary folder)"
    )
    (tmp_path / "ckpt-0000000080").mkdir()
    assert "already holds checkpoints of another job (2, ckpt-0000000040 to ckpt-0000000080)" in refused(
        cluster, model.loss, xy, checkpoint_dir=tmp_path
    )
    file = tmp_path / "notes.txt"
    file.write_text("not a folder")
    assert f"checkpoint_dir '{file}' is a file, not a folder" in refused(cluster, model.loss, xy, checkpoint_dir=file)


def session_error(loss: cg.Tensor, feeds: dict[Any, Any]) -> str:
    """What ``Session.run`` says about the same feeds (the words ``cg.train`` must use)."""
    with pytest.raises(CellgraphError) as err:
        cg.Session(loss.graph).run(loss, feeds)
    return str(err.value)


def test_data_of_the_wrong_width_is_refused_with_session_runs_words(cluster: Cluster, data: digits.Split) -> None:
    model = models.mlp()  # x is a (None, 64) placeholder
    narrow = data.x_train[:, :32]
    message = refused(cluster, model.loss, (narrow, data.y_train), batch_size=64)
    expected = session_error(model.loss, {model.x: narrow[:64], model.y: data.y_train[:64]})
    assert expected == f"feed for 'x:0' ({model.x.node.where()}) has shape (64, 32), expected (None, 64)"
    assert (
        message == f"cg.train: data for placeholder 'x:0' (an array of shape (1438, 32)), in batches of 64: {expected}"
    )


def test_labels_of_a_dtype_the_placeholder_cannot_take_are_refused(cluster: Cluster, data: digits.Split) -> None:
    model = models.mlp()  # y is an int32 placeholder
    labels = data.y_train.astype(np.float32)
    message = refused(cluster, model.loss, (data.x_train, labels), batch_size=32)
    expected = session_error(model.loss, {model.x: data.x_train[:32], model.y: labels[:32]})
    assert expected == f"feed for 'y:0' ({model.y.node.where()}) has dtype float32, expected int32"
    assert message == f"cg.train: data for placeholder 'y:0' (an array of shape (1438,)), in batches of 32: {expected}"


def test_labels_that_do_not_fit_the_placeholder_are_refused_not_wrapped(cluster: Cluster, data: digits.Split) -> None:
    model = models.mlp()  # y is an int32 placeholder
    labels = data.y_train.astype(np.int64)
    labels[5] = 2**31 + 5  # as int32 it would become -2147483643
    message = refused(cluster, model.loss, (data.x_train, labels), batch_size=32)
    assert message == (
        "cg.train: data for placeholder 'y:0' (int64) does not fit int32: it holds 2147483653, outside int32's "
        "range [-2147483648, 2147483647]"
    )
    expected = session_error(model.loss, {model.x: data.x_train[:32], model.y: labels[:32]})
    assert expected == (
        f"feed for 'y:0' ({model.y.node.where()}) (int64) does not fit int32: it holds 2147483653, outside int32's range "
        "[-2147483648, 2147483647]"
    )


def test_data_past_the_placeholders_float_range_is_refused_not_made_inf(cluster: Cluster, data: digits.Split) -> None:
    model = models.mlp()  # x is a float32 placeholder
    images = data.x_train.astype(np.float64)
    images[300, 7] = 1e300  # as float32 it would become inf, and the loss NaN
    message = refused(cluster, model.loss, (images, data.y_train), batch_size=32)
    assert message == (
        "cg.train: data for placeholder 'x:0' (float64) does not fit float32: it holds 1e+300, past float32's "
        "largest finite value 3.40282e+38"
    )
    rows = images[288:320]
    expected = session_error(model.loss, {model.x: rows, model.y: data.y_train[288:320]})
    assert message.endswith(
        expected.removeprefix(f"feed for 'x:0' ({model.x.node.where()}) (float64) does not fit float32")
    )


def test_what_session_run_takes_cg_train_takes(cluster: Cluster, data: digits.Split) -> None:
    model = models.mlp()
    # float64 images for a float32 placeholder: a same-kind cast, which Session.run makes too.
    wide = (data.x_train.astype(np.float64), data.y_train.astype(np.int64))
    cg.Session(model.loss.graph).run(model.loss, {model.x: wide[0][:32], model.y: wide[1][:32]})
    spec = JobSpec.build(
        model.loss, wide, cluster=cluster, optimizer=None, replicas=2, batch_size=32, steps=10, mode="sync",
        replicas_to_aggregate=None, max_staleness=None, checkpoint_every=None, checkpoint_dir=None,
        resume_from=None, nonfinite="reject", seed=0, metrics_interval_s=0.5, timeout_s=60.0,
    )  # fmt: skip
    assert spec.graph.placeholders == ["x:0", "y:0"] and spec.rows == len(data.x_train)
    assert cluster._jobs == {}  # a spec starts nothing


def _policy_mlp(policy: str) -> tuple[cg.Tensor, cg.Tensor, cg.Tensor]:
    g = cg.Graph()
    with g.as_default(), cg.layers.policy(policy):
        x = cg.placeholder((None, 64), name="x")
        y = cg.placeholder((None,), "int32", name="y")
        loss = cg.losses.sparse_softmax_cross_entropy(cg.layers.dense(x, 10, name="logits"), y)
    return loss, x, y


def test_a_float16_forward_pass_on_a_cluster_is_warned_of_and_bfloat16_is_not(
    cluster: Cluster, data: digits.Split
) -> None:
    # A cluster job applies no loss scale: float16 gradients under 6e-08 become zero, and the model trains to
    # another result without a word. bfloat16 has float32's range.
    def build(loss: cg.Tensor) -> JobSpec:
        return JobSpec.build(
            loss, (data.x_train, data.y_train), cluster=cluster, optimizer=None, replicas=2, batch_size=32,
            steps=10, mode="sync", replicas_to_aggregate=None, max_staleness=None, checkpoint_every=None,
            checkpoint_dir=None, resume_from=None, nonfinite="reject", seed=0, metrics_interval_s=0.5,
            timeout_s=60.0,
        )  # fmt: skip

    with pytest.warns(cg.CellgraphWarning) as told:
        build(_policy_mlp("mixed_float16")[0])
    [warning] = told
    assert str(warning.message).startswith(
        "cg.train: the loss's forward pass computes in float16 (Cast 'logits/"
    ) and str(warning.message).endswith(
        "and a cluster job applies no loss scale, so float16 gradients below 6e-08 become zero; on a cluster, "
        "compute in bfloat16 (cg.layers.policy('mixed_bfloat16'), float32's range) or float32, or train with "
        "cg.optim.mixed_precision in a local Session"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build(_policy_mlp("mixed_bfloat16")[0])
        build(_policy_mlp("float32")[0])
    assert cluster._jobs == {}


def test_placeholders_of_another_graph_are_refused(cluster: Cluster, data: digits.Split) -> None:
    model, other = models.mlp(), models.mlp()  # two graphs, with placeholders of the same names
    feeds = {other.x: data.x_train, other.y: data.y_train}
    message = refused(cluster, model.loss, feeds)
    assert message == (
        "cg.train: feed 'x:0' is not in the loss's graph (another graph, or its cell was re-run): "
        "give data for the placeholders the loss was built from"
    )
    assert "feed 'x:0' is not in this session's graph" in session_error(model.loss, feeds)
    # By name, or by the loss's own placeholders, the same arrays are taken.
    for good in ({"x": data.x_train, "y:0": data.y_train}, {model.x: data.x_train, model.y: data.y_train}):
        spec = JobSpec.build(
            model.loss, good, cluster=cluster, optimizer=None, replicas=2, batch_size=32, steps=10, mode="sync",
            replicas_to_aggregate=None, max_staleness=None, checkpoint_every=None, checkpoint_dir=None,
            resume_from=None, nonfinite="reject", seed=0, metrics_interval_s=0.5, timeout_s=60.0,
        )  # fmt: skip
        assert spec.arrays[0] is data.x_train and spec.arrays[1] is data.y_train


def test_data_given_out_of_order_is_refused_saying_so(cluster: Cluster, data: digits.Split) -> None:
    """(y_train, x_train) said only that the labels' shape did not fit x (a new user's try with %train --data)."""
    model = models.mlp()  # x (None, 64) float32, y (None,) int32
    message = refused(cluster, model.loss, (data.y_train, data.x_train), batch_size=32)
    expected = session_error(model.loss, {model.x: data.y_train[:32], model.y: data.x_train[:32]})
    assert message == (
        f"cg.train: data for placeholder 'x:0' (an array of shape (1438,)), in batches of 32: {expected}. The array "
        "given for 'x:0' (argument 1) would fit placeholder 'y:0': give the data in the loss's placeholder order ('x:0', 'y:0')"
    )
    # Data of the right order but a wrong width gets no such hint.
    message = refused(cluster, model.loss, (data.x_train[:, :32], data.y_train), batch_size=32)
    assert message.endswith("has shape (32, 32), expected (None, 64)"), message
