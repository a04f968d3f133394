"""cg.save_model / cg.load_model: a trained model leaves as one folder and runs in a fresh process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import cellgraph as cg
from cellgraph.cluster.errors import ParameterServerError
from cellgraph.cluster.ps.checkpoint import read_shard_checkpoint, write_shard_checkpoint
from cellgraph.cluster.ps.config import OptimizerConfig, TrainingConfig, VariableSpec
from cellgraph.dataflow.errors import GraphError
from cellgraph.dataflow.graphdef import from_tensor_proto
from cellgraph.inference import ExportError, checkpoint_values
from cellgraph.protos import graph_pb2, tensor_pb2
from cellgraph.saved_model import FORMAT

from .conftest import Trained

# Runs in a new interpreter: nothing of this process (graphs, sessions, kernels) is there.
LOADER = textwrap.dedent(
    """
    import sys
    import numpy as np
    import cellgraph as cg

    model = cg.load_model(sys.argv[1])
    x = np.load(sys.argv[2])
    np.savez(sys.argv[3], full=model(x), one=model(x[:1]), batch37=model(x[:37]))
    """
)


def test_a_saved_model_loaded_in_a_new_process_gives_the_sessions_outputs(trained: Trained, tmp_path: Path) -> None:
    m = trained.model
    folder = cg.save_model(tmp_path / "model", m.x, m.logits, trained.session)
    assert sorted(p.name for p in folder.iterdir()) == ["model.graphdef", "signature.json", "variables.safetensors"]
    signature = json.loads((folder / "signature.json").read_text())
    assert signature["inputs"] == [{"name": "x:0", "dtype": "float32", "shape": [None, *m.x.shape[1:]]}]
    assert signature["outputs"] == [{"name": m.logits.name, "dtype": "float32", "shape": [None, 10]}]
    np.save(tmp_path / "x.npy", trained.x_test)
    subprocess.run(
        [sys.executable, "-c", LOADER, str(folder), str(tmp_path / "x.npy"), str(tmp_path / "out.npz")],
        check=True,
        timeout=300,
    )
    got = np.load(tmp_path / "out.npz")
    for key, rows in (("full", len(trained.x_test)), ("one", 1), ("batch37", 37)):
        want = trained.logits(trained.x_test[:rows])
        assert got[key].shape == want.shape
        assert np.abs(got[key] - want).max() <= 1e-4
        assert (got[key].argmax(axis=1) == want.argmax(axis=1)).all()


def test_the_saved_graph_holds_only_what_the_outputs_need(trained: Trained, tmp_path: Path) -> None:
    m = trained.model
    model = cg.load_model(cg.save_model(tmp_path / "model", m.x, m.logits, trained.session))
    ops = {n.op for n in model.graph}
    # No labels, loss, gradients or optimizer steps: the training graph stays behind.
    assert "Placeholder" in ops and not ops & {"ApplyAdam", "SparseSoftmaxCrossEntropyWithLogits", "ReluGrad"}
    assert [n.name for n in model.graph if n.op == "Placeholder"] == ["x"]
    assert model.signature["variables"] == sorted(n.name for n in model.graph.variables())
    # Where the notebook made each node stays with the notebook.
    assert all(n.file is None and n.cell is None and n.line is None for n in model.graph)


def _dropout_model() -> tuple[cg.Graph, cg.Tensor, cg.Tensor, cg.Tensor]:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 4), name="x")
        h = cg.layers.dense(x, 8, activation="relu", name="hidden")
        y = cg.layers.dense(cg.dropout(h, 0.5, name="drop"), 3, name="out")
    return g, x, h, y


def test_dropout_is_switched_off_in_the_saved_model(tmp_path: Path) -> None:
    g, x, h, y = _dropout_model()
    session = cg.Session(g)
    model = cg.load_model(cg.save_model(tmp_path / "m", x, y, session))
    assert "Dropout" not in {n.op for n in model.graph}
    data = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    values = session.variable_values()
    # The inference output: every unit kept, unscaled.
    want = session.run(h, {x: data}) @ values["out/kernel"] + values["out/bias"]
    np.testing.assert_allclose(model(data), want, rtol=1e-6)
    np.testing.assert_array_equal(model(data), model(data))


def test_a_loaded_model_can_be_trained_further(tmp_path: Path) -> None:
    g, x, _, y = _dropout_model()
    loaded = cg.load_model(cg.save_model(tmp_path / "m", x, y, cg.Session(g)))
    data = np.random.default_rng(1).normal(size=(8, 4)).astype(np.float32)
    before = loaded(data)
    with loaded.graph.as_default():
        labels = cg.placeholder((None,), "int32", name="labels")
        loss = cg.losses.sparse_softmax_cross_entropy(loaded.outputs[0], labels)
        step = cg.optim.SGD(0.5).minimize(loss)
    feeds = {loaded.inputs[0]: data, labels: np.zeros(8, np.int32)}
    first = float(loaded.session.run(loss, feeds))
    for _ in range(5):
        loaded.session.run(step, feeds)
    assert float(loaded.session.run(loss, feeds)) < first
    assert not np.allclose(loaded(data), before)


def test_values_come_from_a_mapping_and_are_checked(tmp_path: Path) -> None:
    g, x, _, y = _dropout_model()
    values = cg.Session(g).variable_values()
    values["out/bias"] = np.full(3, 7.0, np.float32)
    model = cg.load_model(cg.save_model(tmp_path / "m", x, y, values))
    assert model(np.zeros((1, 4), np.float32)).tolist() == [[7.0, 7.0, 7.0]]
    del values["out/bias"]
    with pytest.raises(ExportError, match=r"variable 'out/bias' has no value in the dict \(it holds: hidden/bias"):
        cg.save_model(tmp_path / "n", x, y, values)
    values["out/bias"] = np.zeros(4, np.float32)
    with pytest.raises(ExportError, match=r"variable 'out/bias' is float32\(3,\) in the graph but float32\(4,\)"):
        cg.save_model(tmp_path / "n", x, y, values)
    assert not (tmp_path / "n").exists()


def _write_two_shards(
    directory: Path, values: dict[str, np.ndarray], step: int, job_id: str = "test", shards: tuple[int, ...] = (0, 1)
) -> None:
    """A job's checkpoint as two PS shards write it: 'hidden/kernel' split by rows, the rest spread."""
    kernel = values["hidden/kernel"]
    pieces: list[dict[str, tuple[np.ndarray, VariableSpec]]] = [{}, {}]
    for i, rows in enumerate(((0, 2), (2, kernel.shape[0]))):
        part = np.ascontiguousarray(kernel[rows[0] : rows[1]])
        pieces[i]["hidden/kernel"] = (part, VariableSpec("hidden/kernel", part.dtype, part.shape, kernel.shape, rows))
    for i, name in enumerate(n for n in sorted(values) if n != "hidden/kernel"):
        v = values[name]
        pieces[i % 2][name] = (v, VariableSpec(name, v.dtype, v.shape))
    for shard, held in enumerate(pieces):
        if shard not in shards:
            continue
        write_shard_checkpoint(
            directory, job_id=job_id, shard=shard, num_shards=2, global_step=step,
            tensors={k: v for k, (v, _) in held.items()}, versions=dict.fromkeys(held, 1),
            specs=[s for _, s in held.values()], optimizer=OptimizerConfig(), training=TrainingConfig(),
        )  # fmt: skip


def test_values_come_from_a_checkpoint_folder_with_split_variables(tmp_path: Path) -> None:
    g, x, _, y = _dropout_model()
    session = cg.Session(g)
    values = session.variable_values()
    old = {k: v + 1.0 for k, v in values.items()}
    _write_two_shards(tmp_path / "ckpt", old, step=10)
    _write_two_shards(tmp_path / "ckpt", values, step=20)
    read = checkpoint_values(tmp_path / "ckpt")
    assert sorted(read) == sorted(values) and all((read[k] == values[k]).all() for k in values)
    model = cg.load_model(cg.save_model(tmp_path / "m", x, y, tmp_path / "ckpt"))
    data = np.ones((2, 4), np.float32)
    h = np.maximum(data @ values["hidden/kernel"] + values["hidden/bias"], 0)
    np.testing.assert_allclose(model(data), h @ values["out/kernel"] + values["out/bias"], rtol=1e-6)


def _within(seconds: float, call: Any) -> Any:
    """``call()``'s result or error, or a failed test when it has not returned within ``seconds``."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as err:  # noqa: BLE001 - handed to the test's thread
            box["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still reading after {seconds} s (blocked on a FIFO?)"
    if "error" in box:
        raise box["error"]
    return box.get("value")


@pytest.mark.parametrize(
    ("name", "target", "words"),
    [
        ("variables.safetensors", "fifo", "': cannot read variables.safetensors: it is a FIFO, not a regular file"),
        ("model.graphdef", "/dev/null", "': cannot read model.graphdef: it is a character device (a link to '/dev/null'), not a regular file"),
        ("signature.json", "fifo", "/signature.json' cannot be read: it is a FIFO, not a regular file"),
        ("signature.json", "folder", "/signature.json' cannot be read: it is a folder (a link to '"),
    ],
)  # fmt: skip
def test_a_file_of_a_saved_model_that_is_not_a_regular_file_is_refused_unread(
    tmp_path: Path, name: str, target: str, words: str
) -> None:
    """A FIFO blocked load_model for good, and a link to /dev/zero was read until memory ran out (not tried here:
    on the old code it takes the machine's memory); /dev/null read as an empty, 'damaged' file."""
    g, x, _, y = _dropout_model()
    folder = cg.save_model(tmp_path / "m", x, y, cg.Session(g))
    (folder / name).unlink()
    if target == "fifo":
        os.mkfifo(folder / name)
    else:
        (folder / name).symlink_to(tmp_path if target == "folder" else target)
    with pytest.raises(ExportError) as raised:
        _within(30, lambda: cg.load_model(folder))
    assert words in str(raised.value) and "damaged" not in str(raised.value)


def test_a_checkpoint_manifest_that_is_a_fifo_is_skipped_unread(tmp_path: Path) -> None:
    """Listing the checkpoints read every manifest, and blocked for good on a FIFO; asked for by name, it says so."""
    g, _, _, _ = _dropout_model()
    values = cg.Session(g).variable_values()
    _write_two_shards(tmp_path / "ckpt", {k: v + 1.0 for k, v in values.items()}, step=10)
    _write_two_shards(tmp_path / "ckpt", values, step=20)
    manifest = tmp_path / "ckpt" / "ckpt-0000000020" / "shard-1-of-2.json"
    manifest.unlink()
    os.mkfifo(manifest)
    read = _within(30, lambda: checkpoint_values(tmp_path / "ckpt"))  # the newest complete one: step 10
    assert all((read[k] == values[k] + 1.0).all() for k in values)
    with pytest.raises(ParameterServerError, match=r"cannot read manifest .*shard-1-of-2.json: it is a FIFO, not a"):
        _within(30, lambda: read_shard_checkpoint(tmp_path / "ckpt", "ckpt-0000000020", 1, 2))


def test_files_of_two_saves_mixed_in_one_folder_are_refused(tmp_path: Path) -> None:
    """A load while a save replaced the folder's files one by one read one save's graph with the other's
    variables: same names and shapes, so it loaded without a word a model neither save holds (a relu graph with
    a tanh model's values here). The signature, written last, records the sha256 of the files it goes with."""
    folders = []
    for activation in ("relu", "tanh"):
        g = cg.Graph()
        with g.as_default():
            x = cg.placeholder((None, 4), name="x")
            y = cg.layers.dense(cg.layers.dense(x, 8, activation=activation, name="hidden"), 3, name="out")
        values = {k: v + len(folders) for k, v in cg.Session(g).variable_values().items()}  # other values too
        folders.append(cg.save_model(tmp_path / activation, x, y, values))
    relu, tanh = folders
    for name in ("model.graphdef", "variables.safetensors"):
        mixed = tmp_path / f"mixed-{name}"
        shutil.copytree(relu, mixed)
        shutil.copy(tanh / name, mixed / name)  # the tanh save had replaced this file, not yet the others
        with pytest.raises(ExportError) as raised:
            cg.load_model(mixed)
        assert str(raised.value) == (
            f"saved model {str(mixed)!r}: {name} is not the file signature.json was saved with (its sha256 differs): "
            "a save into this folder is under way, or its files come from two saves; load it again once the save "
            "is done"
        )
    # A saved model from before the signature recorded its files still loads.
    signature = json.loads((relu / "signature.json").read_text())
    del signature["sha256"]
    (relu / "signature.json").write_text(json.dumps(signature))
    assert cg.load_model(relu)(np.ones((1, 4), np.float32)).shape == (1, 3)


def test_a_checkpoint_whose_shards_two_jobs_wrote_is_refused_naming_both(tmp_path: Path) -> None:
    """Two jobs given one checkpoint folder: the second's shard 0 of step 20 replaced the first's, and the values
    were the one job's shard 0 joined to the other's shard 1, a model neither trained, without a word."""
    g, x, _, y = _dropout_model()
    values = cg.Session(g).variable_values()
    _write_two_shards(tmp_path / "ckpt", values, step=20, job_id="job-a")
    _write_two_shards(tmp_path / "ckpt", {k: v + 1.0 for k, v in values.items()}, 20, job_id="job-b", shards=(0,))
    with pytest.raises(ExportError) as info:
        checkpoint_values(tmp_path / "ckpt")
    assert (
        f"checkpoint ckpt-0000000020 in folder '{tmp_path / 'ckpt'}' mixes two jobs' shards: shard 0 is job "
        "'job-b''s, shard 1 job 'job-a''s (two jobs wrote into one checkpoint folder); give each job its own "
        "checkpoint folder"
    ) in str(info.value)
    with pytest.raises(ExportError, match="mixes two jobs' shards"):
        cg.save_model(tmp_path / "m", x, y, tmp_path / "ckpt")
    assert not (tmp_path / "m").exists()
    # A job resumed from another's checkpoint writes later steps of its own: the newest is whole, and read.
    _write_two_shards(tmp_path / "ckpt", values, step=30, job_id="job-b")
    assert all((checkpoint_values(tmp_path / "ckpt")[k] == values[k]).all() for k in values)


def test_a_checkpoint_folder_without_checkpoints_is_refused(tmp_path: Path) -> None:
    g, x, _, y = _dropout_model()
    with pytest.raises(ExportError, match=r"checkpoint folder '.*nowhere' does not exist or is not a folder"):
        cg.save_model(tmp_path / "m", x, y, tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ExportError, match=r"checkpoint folder '.*empty' holds no shard manifests"):
        cg.save_model(tmp_path / "m", x, y, tmp_path / "empty")


def test_a_checkpoint_folder_is_read_by_its_files_not_by_the_counts_their_names_claim(tmp_path: Path) -> None:
    g, _, _, _ = _dropout_model()
    values = cg.Session(g).variable_values()
    _write_two_shards(tmp_path / "ckpt", values, step=20)
    (tmp_path / "ckpt" / "ckpt-0000000020" / "shard-0-of-x.json").write_text("{}")  # no shard count: not a manifest
    assert sorted(checkpoint_values(tmp_path / "ckpt")) == sorted(values)
    # One stray name claiming 10**9 shards made a listing of the folder per claimed shard: a hang.
    for manifest in (tmp_path / "ckpt" / "ckpt-0000000020").glob("shard-*-of-2.json"):
        manifest.rename(manifest.with_name(manifest.name.replace("-of-2", "-of-1000000000")))
    raised: list[BaseException] = []

    def read() -> None:
        try:
            checkpoint_values(tmp_path / "ckpt")
        except BaseException as err:  # noqa: BLE001 - the test reads it
            raised.append(err)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(60)
    assert not reader.is_alive(), "checkpoint_values still runs after 60 s"
    [err] = raised
    assert isinstance(err, ExportError)
    assert "holds manifests of a job of 1000000000 shards, but none of shard 2 (shard-2-of-1000000000.json" in str(err)


def test_bad_inputs_and_outputs_are_refused_naming_them(tmp_path: Path) -> None:
    g, x, h, y = _dropout_model()
    with g.as_default():
        other = cg.placeholder((None, 3), name="other")
        z = y + other
        w = g.node("out/kernel").output(0)
        bump = cg.assign_add(w, cg.ones_like(w))
    session = cg.Session(g)
    with pytest.raises(
        ExportError, match=r"input 'hidden/relu:0' is made by Relu 'hidden/relu' .*not by a placeholder"
    ):
        cg.save_model(tmp_path / "m", h, y, session)
    with pytest.raises(
        ExportError, match=r"output needs placeholder Placeholder 'other' .*which is not among the inputs \(x\)"
    ):
        cg.save_model(tmp_path / "m", x, z, session)
    with pytest.raises(
        ExportError, match=r"output needs AssignAdd 'assign_add' .*, which changes state \(training only\)"
    ):
        cg.save_model(tmp_path / "m", x, bump, session)
    with pytest.raises(ExportError, match=r"outputs: .* is not a Tensor"):
        cg.save_model(tmp_path / "m", x, [g.node("out/bias_add")], session)  # type: ignore[list-item]
    with pytest.raises(ExportError, match=r"cannot read variable values from a int: give a Session, a Job"):
        cg.save_model(tmp_path / "m", x, y, 3)
    assert not (tmp_path / "m").exists()


def test_loading_refuses_what_is_not_a_saved_model(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match=r"saved model signature '.*nothing/signature.json' is missing"):
        cg.load_model(tmp_path / "nothing")
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "signature.json").write_text('{"format": "else"}')
    with pytest.raises(ExportError, match=r"is not a cellgraph saved model"):
        cg.load_model(tmp_path / "odd")
    g, x, _, y = _dropout_model()
    folder = cg.save_model(tmp_path / "m", x, y, cg.Session(g))
    (folder / "variables.safetensors").unlink()
    with pytest.raises(ExportError, match=r"saved model '.*m' is missing variables.safetensors"):
        cg.load_model(folder)


def test_a_tampered_signature_or_graph_is_refused_naming_the_folder(tmp_path: Path) -> None:
    # Each raised a bare AttributeError or ValueError from deep inside the rebuild.
    g, x, _, y = _dropout_model()
    folder = cg.save_model(tmp_path / "m", x, y, cg.Session(g))
    signature = json.loads((folder / "signature.json").read_text())
    (folder / "signature.json").write_text(json.dumps({**signature, "outputs": [{"name": 5}]}))
    with pytest.raises(ExportError) as raised:
        cg.load_model(folder)
    assert "signature.json's 'outputs' must be a list of objects with a tensor 'name' (as save_model writes it), " \
        'got [{"name": 5}]' in str(raised.value)  # fmt: skip
    (folder / "signature.json").write_text(json.dumps(signature))
    graphdef = graph_pb2.GraphDef.FromString((folder / "model.graphdef").read_bytes())
    const = graphdef.node.add(name="huge", op="Const")
    const.attr["value"].tensor.dtype = tensor_pb2.DT_FLOAT32
    const.attr["value"].tensor.shape.dim[:] = [1 << 40, 1 << 40]  # 2**80 elements: 0 in int64
    (folder / "model.graphdef").write_bytes(graphdef.SerializeToString())
    with pytest.raises(ExportError) as raised:
        cg.load_model(folder)
    assert f"saved model {str(folder)!r} does not rebuild: " in str(raised.value)
    assert "a float32 tensor of shape (1099511627776, 1099511627776) needs 4835703278458516698824704 bytes of " \
        "content, got 0" in str(raised.value)  # fmt: skip


@pytest.mark.parametrize(
    ("dtype", "dims", "words"),
    [(tensor_pb2.DT_FLOAT32, [1 << 40, 1 << 40], "needs 4835703278458516698824704 bytes of content, got 0"),
     (tensor_pb2.DT_INT64, [1 << 32, 1 << 32], "needs 147573952589676412928 bytes of content, got 0"),
     (tensor_pb2.DT_STRING, [1 << 32, 1 << 32], "needs 18446744073709551616 strings and no content, got 0 strings")],
)  # fmt: skip
def test_a_tensor_value_whose_dims_overflow_int64_is_refused_by_its_true_size(
    dtype: int, dims: list[int], words: str
) -> None:
    # NumPy's int64 product of these dims wraps to 0: an empty tensor passed the length check.
    proto = tensor_pb2.TensorProto(dtype=dtype)
    proto.shape.dim[:] = dims
    with pytest.raises(GraphError, match=words):
        from_tensor_proto(proto)


def test_a_loaded_model_names_its_inputs_when_called_wrongly(tmp_path: Path) -> None:
    g, x, _, y = _dropout_model()
    model = cg.load_model(cg.save_model(tmp_path / "m", x, y, cg.Session(g)))
    with pytest.raises(ExportError, match=r"this model takes 1 input\(s\) \(x:0\), got 2"):
        model(np.zeros((1, 4)), np.zeros((1, 4)))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "int8", "uint8", "float64"])
def test_a_model_of_any_dtype_loads_back_bit_for_bit(tmp_path: Path, dtype: str) -> None:
    # safetensors' own NumPy loader has no bfloat16: a bfloat16 model was saved and then refused as "damaged".
    import ml_dtypes

    storage = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    init = np.array([1, 2, 100] if "int" in dtype else [1.5, -2.25, 3.0e38 if dtype == "bfloat16" else 1e4], storage)
    g = cg.Graph()
    with g.as_default():
        w = cg.variable(init, dtype=dtype, name="w")
        x = cg.placeholder((3,), dtype, name="x")
        y = x * w
    sess = cg.Session(g)
    cg.save_model(tmp_path / "m", x, y, sess)
    ones = np.ones(3, storage)
    got = np.asarray(cg.load_model(tmp_path / "m")(ones))
    assert got.dtype == np.dtype(storage)
    assert got.tobytes() == np.asarray(sess.run(y, {x: ones})).tobytes() == init.tobytes()


def test_a_tensor_of_a_dtype_cellgraph_does_not_read_is_refused_by_name() -> None:
    from cellgraph.saved_model import read_arrays

    # A safetensors file by hand: an 8-byte header length, the JSON header, then the data (4 float8 values).
    header = json.dumps({"w": {"dtype": "F8_E4M3", "shape": [4], "data_offsets": [0, 4]}}).encode()
    with pytest.raises(ExportError) as err:
        read_arrays(len(header).to_bytes(8, "little") + header + bytes(4))
    assert str(err.value) == "tensor 'w' has safetensors dtype F8_E4M3, which cellgraph does not read"


def test_a_scalar_variable_saves_and_loads_back(tmp_path: Path) -> None:
    # NumPy's ascontiguousarray makes a 0-d array 1-d: the saved scale was (1,) and the model did not load.
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 2), name="x")
        w = cg.variable(np.array([1.0, 2.0], np.float32), name="w")
        scale = cg.variable(np.float32(1.5), name="scale", trainable=False)
        out = cg.reduce_sum(x * w, axis=1) * scale
    session = cg.Session(g)
    data = np.ones((3, 2), np.float32)
    loaded = cg.load_model(cg.save_model(tmp_path / "m", x, out, session))
    np.testing.assert_array_equal(loaded(data), session.run(out, {x: data}))


def test_a_variables_file_that_does_not_match_the_graph_is_refused_naming_both(tmp_path: Path) -> None:
    import safetensors.numpy

    g, x, _, y = _dropout_model()
    folder = cg.save_model(tmp_path / "m", x, y, cg.Session(g))
    values = safetensors.numpy.load_file(str(folder / "variables.safetensors"))
    values["out/bias"] = np.zeros(4, np.float32)
    (folder / "variables.safetensors").write_bytes(safetensors.numpy.save(values, metadata={"format": FORMAT}))
    with pytest.raises(ExportError, match=r"variable 'out/bias' is float32\(4,\) in variables.safetensors but \(3,\) "
                       r"of the same dtype in model.graphdef"):  # fmt: skip
        cg.load_model(folder)
    values["out/bias"] = np.zeros(3, np.float64)
    (folder / "variables.safetensors").write_bytes(safetensors.numpy.save(values, metadata={"format": FORMAT}))
    with pytest.raises(ExportError, match=r"variable 'out/bias' is float64\(3,\) in variables.safetensors but \(3,\) "
                       r"of another dtype in model.graphdef"):  # fmt: skip
        cg.load_model(folder)


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (
            lambda s: s["inputs"][0].update(shape=[None, 5]),
            "signature.json says input 'x:0' is float32 [null, 5], but model.graphdef makes it float32 [null, 4]",
        ),
        (
            lambda s: s["outputs"][0].update(dtype="int8"),
            "signature.json says output 'out/bias_add:0' is int8 [null, 3], but model.graphdef makes it float32",
        ),
        (
            lambda s: s.update(variables=[*s["variables"], "zz"]),
            'signature.json lists variables ["hidden/bias", "hidden/kernel", "out/bias", "out/kernel", "zz"], but '
            'variables.safetensors holds ["hidden/bias", "hidden/kernel", "out/bias", "out/kernel"]',
        ),
    ],
)
def test_a_signature_that_disagrees_with_the_graph_or_the_variables_is_refused_naming_both(
    tmp_path: Path, edit: Any, words: str
) -> None:
    """Each loaded without a word: a reader of the signature was told a dtype, shape or variable the model lacks."""
    g, x, _, y = _dropout_model()
    folder = cg.save_model(tmp_path / "m", x, y, cg.Session(g))
    signature = json.loads((folder / "signature.json").read_text())
    edit(signature)
    (folder / "signature.json").write_text(json.dumps(signature))
    with pytest.raises(ExportError) as raised:
        cg.load_model(folder)
    assert f"saved model {str(folder)!r}: {words}" in str(raised.value)
