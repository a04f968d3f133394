"""RMSProp, Adagrad and AdamW on parameter servers: the optimizer registry's entries, as PyTorch runs them.

The servers read the same registry as the local executor: its kinds, slots,
hyperparameter rules and update functions. These tests check the new kinds
end to end: the config and its protobuf form, the store against the local
``Apply*`` op, real gRPC servers against torch.optim, and one ``cg.train`` job
on a LocalCluster.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

import cellgraph as cg
from cellgraph.cluster.errors import ParameterServerError
from cellgraph.cluster.ps.checkpoint import read_shard_checkpoint, write_shard_checkpoint
from cellgraph.cluster.ps.config import SLOTS, OptimizerConfig, TrainingConfig, VariableSpec
from cellgraph.cluster.ps.messages import optimizer_from_proto, optimizer_to_proto
from cellgraph.cluster.ps.store import ParameterStore
from cellgraph.dataflow.ops.training import apply_optimizer
from cellgraph.protos import parameter_service_pb2 as pb

from .conftest import Servers
from .test_limits import init_chunk, job, refused

torch = pytest.importorskip("torch", reason="compares against PyTorch: pip install torch==2.13.0")

TorchOptimizer = Callable[[list[Any]], Any]
# kind: (the servers' config, the same optimizer in torch.optim, rtol between them over the steps below).
# RMSProp adds epsilon inside the square root (TensorFlow), torch outside, and Adam(W) after bias
# correction where torch adds it before: so epsilon is 1e-16 here, far below the smallest mean square
# these gradients make (random normal ones come as small as 1e-4), and the two agree to rounding.
NEW: dict[str, tuple[OptimizerConfig, TorchOptimizer, float]] = {
    "rmsprop": (
        OptimizerConfig("rmsprop", 0.01, decay=0.8, momentum=0.5, epsilon=1e-16),
        lambda ps: torch.optim.RMSprop(ps, lr=0.01, alpha=0.8, momentum=0.5, eps=1e-16),
        1e-9,
    ),
    "adagrad": (
        OptimizerConfig("adagrad", 0.1, initial_accumulator_value=0.2, epsilon=1e-6),
        lambda ps: torch.optim.Adagrad(ps, lr=0.1, initial_accumulator_value=0.2, eps=1e-6),
        1e-12,
    ),
    "adamw": (
        OptimizerConfig("adamw", 0.01, weight_decay=0.1, epsilon=1e-16),
        lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1, eps=1e-16),
        1e-9,
    ),
}
STEPS = 6


def _gradients(shape: tuple[int, ...], dtype: np.dtype, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(size=shape).astype(dtype) for _ in range(STEPS)]


def _torch_run(make: TorchOptimizer, init: dict[str, np.ndarray], grads: list[dict[str, np.ndarray]]) -> dict[str, Any]:
    """torch.optim's values after one step per gradient, each gradient given as it is (not computed)."""
    params = {name: torch.tensor(value) for name, value in init.items()}
    opt = make(list(params.values()))
    for step in grads:
        for name, p in params.items():
            p.grad = torch.tensor(step[name])
        opt.step()
    return {name: p.numpy() for name, p in params.items()}


# ------------------------------------------------------------------ the config
def test_a_kind_fills_its_own_defaults_and_only_those() -> None:
    config = OptimizerConfig("adagrad")
    assert (config.learning_rate, config.initial_accumulator_value, config.epsilon) == (0.01, 0.1, 1e-7)
    assert (config.momentum, config.beta1, config.decay, config.weight_decay) == (None, None, None, None)
    assert config.hyperparameters == {"initial_accumulator_value": 0.1, "epsilon": 1e-7}
    assert repr(OptimizerConfig("adamw", 0.5)) == (
        "OptimizerConfig(kind='adamw', learning_rate=0.5, beta1=0.9, beta2=0.999, epsilon=1e-08, weight_decay=0.01)"
    )
    assert SLOTS["rmsprop"] == ("ms", "mom") and SLOTS["adagrad"] == ("accumulator",)
    assert SLOTS["adamw"] == ("m", "v", "t")


BAD = [
    ("rmsprop decay of 1", "rmsprop", {"decay": 1.0}, "rmsprop optimizer: decay must be in [0, 1), got 1.0"),
    ("rmsprop NaN momentum", "rmsprop", {"momentum": float("nan")}, "rmsprop optimizer: momentum must be a finite number, 0 or more, got nan"),
    ("rmsprop momentum of 1", "rmsprop", {"momentum": 1.0}, "rmsprop optimizer: momentum must be in [0, 1), got 1.0"),
    ("rmsprop negative epsilon", "rmsprop", {"epsilon": -1.0}, "rmsprop optimizer: epsilon must be a finite number, 0 or more, got -1.0"),
    ("adagrad negative initial", "adagrad", {"initial_accumulator_value": -0.5}, "adagrad optimizer: initial_accumulator_value must be a finite number, 0 or more, got -0.5"),
    ("adagrad infinite epsilon", "adagrad", {"epsilon": float("inf")}, "adagrad optimizer: epsilon must be a finite number, 0 or more, got inf"),
    ("adamw infinite weight decay", "adamw", {"weight_decay": float("inf")}, "adamw optimizer: weight_decay must be a finite number, 0 or more, got inf"),
    ("adamw negative weight decay", "adamw", {"weight_decay": -0.1}, "adamw optimizer: weight_decay must be a finite number, 0 or more, got -0.1"),
    ("adamw beta1 of 1", "adamw", {"beta1": 1.0}, "adamw optimizer: beta1 must be in [0, 1), got 1.0"),
    ("momentum of 1", "momentum", {"momentum": 1.0}, "momentum optimizer: momentum must be in [0, 1), got 1.0"),
    ("adagrad NaN learning rate", "adagrad", {"learning_rate": float("nan")}, "adagrad optimizer: learning_rate must be a finite number, 0 or more, got nan"),
]  # fmt: skip


@pytest.mark.parametrize(("what", "kind", "fields", "words"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_hyperparameter_is_refused_by_the_config_and_at_the_servers_door(
    ps: Servers, what: str, kind: str, fields: dict[str, float], words: str
) -> None:
    with pytest.raises(ParameterServerError, match="^" + words.replace("[", r"\[").replace(")", r"\)") + "$"):
        OptimizerConfig(kind, **fields)  # type: ignore[arg-type]
    ps.start(1)
    proto = pb.OptimizerConfigProto(kind=kind, **{"learning_rate": 0.1, **fields})
    err = refused(ps, [job(optimizer=proto), init_chunk()])
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
    assert words in (err.details() or "")


def test_a_hyperparameter_the_kind_does_not_take_is_refused() -> None:
    with pytest.raises(
        ParameterServerError, match=r"^sgd optimizer: it has no hyperparameter momentum \(it takes learning_rate\)$"
    ):
        OptimizerConfig("sgd", momentum=0.9)
    with pytest.raises(
        ParameterServerError,
        match=r"^rmsprop optimizer: it has no hyperparameter beta1, weight_decay \(it takes learning_rate, decay, "
        r"momentum, epsilon, centered\)$",
    ):
        OptimizerConfig("rmsprop", beta1=0.9, weight_decay=0.1)


def test_every_kind_goes_through_its_protobuf_form_unchanged() -> None:
    configs = [
        OptimizerConfig("sgd", 0.5),
        OptimizerConfig("momentum", 0.1, momentum=0.7, nesterov=True),
        OptimizerConfig("adam", 0.01, beta1=0.8, beta2=0.99, epsilon=1e-6),
        OptimizerConfig("rmsprop", 0.02, decay=0.7, momentum=0.3, epsilon=1e-5),
        OptimizerConfig("adagrad", 0.3, initial_accumulator_value=0.4, epsilon=1e-4),
        OptimizerConfig("adamw", 0.004, beta1=0.5, beta2=0.6, epsilon=1e-3, weight_decay=0.2),
        OptimizerConfig("adamw", 0.004, weight_decay=0.2, amsgrad=True),
        OptimizerConfig("rmsprop", 0.02, decay=0.7, centered=True),
        OptimizerConfig("adamax", 0.02, beta1=0.5, beta2=0.6, epsilon=1e-3),
        OptimizerConfig("nadam", 0.02, beta1=0.5, beta2=0.6, epsilon=1e-3, momentum_decay=0.01),
        OptimizerConfig("adadelta", 0.5, rho=0.7, epsilon=1e-4),
    ]
    assert sorted({c.kind for c in configs}) == sorted(SLOTS)
    for config in configs:
        assert optimizer_from_proto(optimizer_to_proto(config)) == config
    # A field of another kind on the wire is not read: what a kind takes is the registry's.
    proto = optimizer_to_proto(configs[3])
    proto.beta1 = 0.25
    assert optimizer_from_proto(proto) == configs[3]


# ------------------------------------------------------------------ the store runs the local op's update
def _local_run(opt: OptimizerConfig, init: np.ndarray, gradients: list[np.ndarray]) -> dict[str, np.ndarray]:
    """The variable and its slots after a cg.Session ran the kind's Apply op once per gradient."""
    dtype = init.dtype.name
    graph = cg.Graph()
    with graph.as_default():
        w = cg.variable(init, dtype=dtype, name="w")
        slots = {
            name: cg.variable(
                np.zeros(() if name == "t" else init.shape), dtype=dtype, name=f"w/{name}", trainable=False
            )
            for name in SLOTS[opt.kind]
        }
        grad = cg.placeholder(init.shape, dtype, name="grad")
        lr = cg.constant(opt.learning_rate, dtype=dtype, name="lr")
        train = apply_optimizer(opt.kind, w, slots, lr, grad, opt.hyperparameters)
    sess = cg.Session(graph)
    for gradient in gradients:
        sess.run(train, {grad: gradient})
    values = sess.run([w, *slots.values()])
    return dict(zip(["w", *(f"w/{name}" for name in slots)], values))


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("kind", list(NEW))
@pytest.mark.parametrize("mode", ["async", "sync"])
def test_the_store_moves_a_variable_exactly_as_the_local_op_does(mode: str, kind: str, dtype: type) -> None:
    rng = np.random.default_rng(3)
    init = rng.normal(size=(3, 4)).astype(dtype)
    gradients = _gradients((3, 4), np.dtype(dtype))
    opt = NEW[kind][0]
    k = 2 if mode == "sync" else 1  # two replicas pushing the same gradient: the mean is exactly it
    spec = VariableSpec("w", np.dtype(dtype), (3, 4))
    store = ParameterStore("j", [spec], {"w": init}, opt, TrainingConfig(mode, k))  # type: ignore[arg-type]
    for replica in range(k):
        store.register(replica)
    for step, gradient in enumerate(gradients):
        for replica in range(k):
            store.push(replica, step, {"w": gradient})
    expected = _local_run(opt, init, gradients)
    state = store.state()
    assert state.tensors.keys() == expected.keys()
    for key, value in expected.items():
        np.testing.assert_array_equal(state.tensors[key], value, err_msg=key)


# ------------------------------------------------------------------ real servers against torch.optim
@pytest.mark.parametrize("kind", list(NEW))
def test_servers_train_as_torch_optim_does(ps: Servers, kind: str) -> None:
    opt, make, rtol = NEW[kind]
    ps.start(2)
    rng = np.random.default_rng(5)
    init = {"w": rng.normal(size=(40, 30)), "b": rng.normal(size=(30,))}
    f64 = np.dtype(np.float64)
    grads = [{"w": gw, "b": gb} for gw, gb in zip(_gradients((40, 30), f64), _gradients((30,), f64, seed=1))]
    client = ps.client()
    client.init(f"opt-{kind}", init, opt, TrainingConfig("async"), split_threshold=4_000)
    assert len({shard for pieces in client.layout.values() for shard, _ in pieces}) == 2  # type: ignore[union-attr]
    client.register(0)
    for step, grad in enumerate(grads):
        assert client.push(grad, step=step, replica_id=0).status == "applied"
    got = client.pull().values
    want = _torch_run(make, init, grads)
    for name in init:
        assert not np.allclose(got[name], init[name])
        np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=1e-12, err_msg=name)


# ------------------------------------------------------------------ cg.train on a LocalCluster
@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    from cellgraph.cluster.cluster import Cluster

    with Cluster.local(workers=1, ps=2) as local:
        yield local


@pytest.mark.slow
def test_cg_train_with_rmsprop_on_a_local_cluster_matches_the_local_executor_and_torch(cluster: Any) -> None:
    rng = np.random.default_rng(7)
    x_data, w0, b0 = rng.normal(size=(8, 5)), rng.normal(size=(5, 3)) * 0.5, rng.normal(size=(3,)) * 0.1
    steps = 5

    def build() -> tuple[cg.Graph, cg.Tensor, cg.Tensor, cg.Tensor, cg.Tensor]:
        g = cg.Graph()
        with g.as_default():
            x = cg.placeholder((None, 5), "float64", name="x")
            w = cg.variable(w0, dtype="float64", name="w")
            b = cg.variable(b0, dtype="float64", name="b")
            loss = cg.reduce_sum(cg.square(cg.tanh(x @ w + b)), name="loss")
        return g, x, w, b, loss

    def optimizer() -> cg.optim.RMSProp:
        return cg.optim.RMSProp(0.05, decay=0.8, momentum=0.5, epsilon=1e-16)  # torch adds epsilon elsewhere

    g, x, w, b, loss = build()
    with g.as_default():
        train = optimizer().minimize(loss)
    sess = cg.Session(g)
    for _ in range(steps):
        sess.run(train, {x: x_data})
    local = {"w": sess.run(w), "b": sess.run(b)}

    _, _, _, _, loss = build()
    # One replica whose every batch is all eight rows: the same gradient as the local run, step by step.
    job_ = cg.train(
        loss, (x_data,), cluster=cluster, optimizer=optimizer(), replicas=1, batch_size=len(x_data), steps=steps,
        checkpoint_every=None,
    )  # fmt: skip
    try:
        job_.wait(120.0)
        assert job_.status == "finished", job_.events
        got = job_.variables()
    finally:
        job_.close()

    tw, tb = (torch.tensor(v, requires_grad=True) for v in (w0, b0))
    tx = torch.tensor(x_data)
    topt = torch.optim.RMSprop([tw, tb], lr=0.05, alpha=0.8, momentum=0.5, eps=1e-16)
    for _ in range(steps):
        topt.zero_grad()
        torch.tanh(tx @ tw + tb).square().sum().backward()
        topt.step()
    for name, want in (("w", tw), ("b", tb)):
        np.testing.assert_allclose(got[name], local[name], rtol=1e-9, atol=1e-12, err_msg=f"{name}: cluster vs local")
        np.testing.assert_allclose(got[name], want.detach().numpy(), rtol=1e-9, err_msg=f"{name}: cluster vs torch")


def test_a_checkpoint_manifest_from_before_the_registry_still_reads(tmp_path: Path) -> None:
    """Such a manifest lists every field of every kind: only those of its kind are read."""
    w = np.full(4, 2.0, np.float32)
    info = write_shard_checkpoint(
        tmp_path, tensors={"w": w}, versions={"w": 3}, specs=[VariableSpec("w", w.dtype, w.shape)], global_step=3,
        shard=0, num_shards=1, job_id="old", optimizer=OptimizerConfig("sgd", 0.5), training=TrainingConfig(),
    )  # fmt: skip
    manifest = json.loads(info.manifest_file.read_text())
    assert manifest["optimizer"]["momentum"] is None  # written now: the fields sgd does not take are null
    manifest["optimizer"] = {
        "kind": "sgd", "learning_rate": 0.5, "momentum": 0.9, "nesterov": False, "beta1": 0.9, "beta2": 0.999,
        "epsilon": 1e-8,
    }  # fmt: skip
    info.manifest_file.write_text(json.dumps(manifest))
    assert read_shard_checkpoint(tmp_path, info.name, 0, 1).optimizer == OptimizerConfig("sgd", 0.5)
