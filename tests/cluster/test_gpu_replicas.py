"""Replicas on their workers' GPUs: a cluster whose training workers have a GPU computes each replica's step there.

The workers of these clusters run Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``
in their environment, read when they start): each has one "GPU", which the
job finds by asking them. The model is small (the simulator runs every CUDA
thread as a Python thread). The same job on the workers' CPUs is the reference.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

import cellgraph as cg
from cellgraph.cluster.cluster import Cluster
from cellgraph.cluster.gpus import GpuCounts
from cellgraph.cluster.placed_training import WORKER_GPU, place_training
from cellgraph.cluster.ps import OptimizerConfig
from cellgraph.cluster.training_graph import WORKER_CPU, DeviceRun, TrainingError, load, prepare

TIMEOUT = 180.0
ROWS, BATCH, STEPS = 32, 8, 3


def linear_model() -> tuple[cg.Tensor, cg.Tensor]:
    """A linear regression of 3 features: elementwise ops and reductions, each with a CUDA kernel."""
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 3), "float32", name="x")
        y = cg.placeholder((None,), "float32", name="y")
        w = cg.variable(np.array([0.5, -1.0, 2.0], np.float32), name="w")
        b = cg.variable(np.float32(0.1), name="b")
        pred = cg.reduce_sum(x * w, axis=1) + b
        loss = cg.reduce_mean(cg.square(pred - y), name="loss")
    return loss, pred


def linear_data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    x = rng.random((ROWS, 3), dtype=np.float32)
    return x, (x @ np.array([1.0, 2.0, -1.0], np.float32) + 0.5).astype(np.float32)


@pytest.fixture(scope="module")
def simulated_gpus() -> Iterator[Cluster]:
    """A cluster of one PS and one training worker whose processes run the CUDA simulator."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("NUMBA_ENABLE_CUDASIM", "1")  # the Nannies start their workers from this process's environment
        cluster = Cluster.local(workers=1, ps=1)
    with cluster:
        yield cluster


def test_the_worker_partition_keeps_its_gpu_ops_and_computes_what_the_cpu_computes() -> None:
    loss, _ = linear_model()
    tg = prepare(loss)
    x, y = linear_data()
    values = {name: np.asarray(v) for name, v in tg.initial.items()}
    results = []
    for gpu in (False, True):
        placed = place_training(tg, OptimizerConfig("sgd", 0.1), ps_tasks=1, worker_gpu=gpu)
        devices = {placed.placement.device_of[n.name] for n in placed.graph.nodes}
        assert (WORKER_GPU in devices) is gpu
        loaded = load(placed.worker)
        on_gpu = [n.name for n in loaded.graph.nodes if n.device == WORKER_GPU]
        # Every op that has a CUDA kernel; the pulled values arrive on the worker's CPU (Recv) and are copied in.
        assert bool(on_gpu) is gpu and isinstance(loaded._run, DeviceRun) is gpu
        assert all(n.device in (WORKER_CPU, WORKER_GPU) for n in loaded.graph.nodes)
        if gpu:
            from cellgraph.dataflow.kernels import cuda

            if not cuda.available():
                return  # this process has no CUDA (the cluster test below runs it in the workers)
        results.append(loaded.compute(values, loaded.convert([x[:BATCH], y[:BATCH]])))
    (cpu_loss, cpu_grads), (gpu_loss, gpu_grads) = results
    assert gpu_loss == pytest.approx(cpu_loss, rel=1e-6)
    for name, grad in cpu_grads.items():
        np.testing.assert_allclose(gpu_grads[name], grad, rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_a_job_on_gpu_workers_trains_as_the_same_job_on_their_cpus(simulated_gpus: Cluster) -> None:
    loss, _ = linear_model()
    trained = {}
    for gpu in (True, False):
        job = cg.train(
            loss, linear_data(), cluster=simulated_gpus, optimizer=cg.optim.SGD(0.1), replicas=1,
            batch_size=BATCH, steps=STEPS, checkpoint_every=None, gpu=gpu, timeout_s=TIMEOUT,
        )  # fmt: skip
        try:
            job.wait(TIMEOUT)
            trained[gpu] = job.variables()
            gpu_ops = [n for n, d in job.placement.device_of.items() if d == WORKER_GPU]
            assert bool(gpu_ops) is gpu
            said = "replicas compute on their workers' GPUs" if gpu else "on their workers' CPUs (gpu=False)"
            assert said in "\n".join(job.events)
        finally:
            job.close()
    for name, value in trained[False].items():
        np.testing.assert_allclose(trained[True][name], value, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_gpu_true_on_workers_without_a_gpu_is_refused_and_none_trains_on_their_cpus() -> None:
    loss, _ = linear_model()
    with pytest.MonkeyPatch.context() as env:
        env.delenv("NUMBA_ENABLE_CUDASIM", raising=False)
        cluster = Cluster.local(workers=1, ps=1)
    with cluster:
        with pytest.raises(TrainingError, match=r"cg.train\(gpu=True\): training worker\(s\) tcp://127\.0\.0\.1:\d+ "
                           r"have no GPU that numba.cuda sees; every training worker needs one"):  # fmt: skip
            cg.train(loss, linear_data(), cluster=cluster, replicas=1, batch_size=BATCH, steps=STEPS, gpu=True)
        job = cg.train(loss, linear_data(), cluster=cluster, replicas=1, batch_size=BATCH, steps=STEPS)
        try:
            job.wait(TIMEOUT)
            assert WORKER_GPU not in set(job.placement.device_of.values()) and job.status == "finished"
        finally:
            job.close()


def test_a_gpu_that_is_not_a_bool_is_refused(simulated_gpus: Cluster) -> None:
    loss, _ = linear_model()
    with pytest.raises(TrainingError, match=r"cg.train: gpu must be True, False or None .*, got 'yes'"):
        cg.train(loss, linear_data(), cluster=simulated_gpus, replicas=1, gpu="yes")  # type: ignore[arg-type]


def test_each_worker_is_asked_for_its_gpus_once() -> None:
    # Counting imports numba.cuda in the worker (tenths of a second): cg.train, which asks at every call and must
    # return at once, asks only workers not counted yet (a restarted worker has a new address).
    asked: list[list[str]] = []
    counts = GpuCounts()

    def ask(workers: list[str]) -> dict[str, int]:
        asked.append(workers)
        return dict.fromkeys(workers, 1)

    assert counts.of(["a", "b"], ask) == {"a": 1, "b": 1}
    assert counts.of(["b", "c"], ask) == {"b": 1, "c": 1}
    assert counts.of(["a", "c"], ask) == {"a": 1, "c": 1}
    assert asked == [["a", "b"], ["c"]]
