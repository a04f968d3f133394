"""A graph cut into per-device partitions runs to the same numbers as the whole."""

from __future__ import annotations

import concurrent.futures
import signal
import threading

import numpy as np
import pytest

import cellgraph as cg
from cellgraph.dataflow.opdef import KernelContext
from cellgraph.dataflow.variables import VariableStore
from cellgraph.examples import models
from tests.deadlines import unless_it_hangs

PS = "/job:ps/task:0/device:cpu:0"
WORKER = "/job:worker/task:0/device:cpu:0"
HANG_S = 60.0  # bounds a hang of a run that must end by itself


def ps_holds_state(g: cg.Graph) -> dict[str, str]:
    """Variables and the ops that update them in place on the PS, the rest on the worker."""
    return {n.name: PS if n.opdef.stateful else WORKER for n in g.nodes}


def _batches(image: bool, n: int = 3):  # noqa: ANN202
    """The same batch ``n`` times, so a few steps must lower its loss."""
    rng = np.random.default_rng(0)
    shape = (16, 8, 8, 1) if image else (16, 64)
    batch = (rng.random(shape, dtype=np.float32), rng.integers(0, 10, 16).astype(np.int32))
    return [batch] * n


@pytest.mark.parametrize("build", [models.mlp, models.mini_inception], ids=["mlp", "mini-inception"])
def test_training_across_partitions_matches_one_device(build) -> None:  # noqa: ANN001
    losses = []
    for partitioned in (False, True):
        m = build(optimizer=cg.optim.Adam(1e-2))
        sess = (
            cg.PartitionedSession(m.graph, ps_holds_state(m.graph), timeout=20) if partitioned else cg.Session(m.graph)
        )
        run = []
        for xb, yb in _batches(m.image_input):
            _, loss = sess.run([m.train_op, m.loss], {m.x: xb, m.y: yb})
            run.append(float(loss))
        losses.append(run)
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)
    assert losses[1][-1] < losses[1][0]


def test_one_send_recv_pair_per_tensor_per_destination() -> None:
    g = cg.Graph()
    with g.as_default():
        w = cg.variable(np.ones((2, 2), np.float32), name="w")
        x = cg.placeholder((None, 2), name="x")
        a = x @ w
        b = cg.reduce_sum(w * 2.0)  # a second consumer of w on the worker
        total = cg.reduce_sum(a) + b
    parts = cg.partition(g, {n.name: PS if n.name == "w" else WORKER for n in g.nodes})
    assert [e.tensor.name for e in parts.edges] == ["w:0"]
    assert sorted(parts.edges[0].consumers) == ["matmul", "mul"]
    assert [n.op for n in parts.graphs[PS].nodes] == ["Variable", "Send"]
    assert parts.copies["matmul"].device == WORKER
    assert g.node("matmul").device == ""  # the original graph is untouched
    sess = cg.PartitionedSession(g, parts.device_of)
    np.testing.assert_allclose(sess.run(total, {x: np.ones((3, 2))}), 12.0 + 8.0)


def test_control_dependencies_cross_devices() -> None:
    g = cg.Graph()
    with g.as_default():
        counter = cg.variable(0.0, name="counter")
        bump = cg.assign_add(counter, 1.0)
        with cg.control_dependencies([bump]):
            done = cg.no_op(name="done")
    placement = {"counter": PS, "assign_add": PS, "const": PS, "done": WORKER}
    sess = cg.PartitionedSession(g, placement)
    sess.run(done)
    sess.run(done)
    assert sess.run(counter) == 2.0
    assert any(e.tensor.node.op == "Const" and e.dst == WORKER for e in sess.parts.edges)


def test_a_read_after_an_update_on_the_variables_device_sees_the_update() -> None:
    # As on one device: identity(w) under a control dependency on w's update reads the updated w. Its value was
    # sent right after w, before the update, so the worker read the old one; a plain reader still shares that Send.
    g = cg.Graph()
    with g.as_default():
        w = cg.variable(np.zeros(2, np.float32), name="w")
        upd = cg.assign_add(w, np.ones(2, np.float32), name="upd")
        before = cg.identity(w, name="before") * 1.0
        with cg.control_dependencies([upd]):
            after = cg.identity(w, name="after") * 1.0
    alone = cg.Session(g).run(after)
    placement = {n.name: PS if n.name in ("w", "upd") or n.name.startswith("const") else WORKER for n in g.nodes}
    sess = cg.PartitionedSession(g, placement)
    np.testing.assert_array_equal(sess.run(after), alone)  # [1, 1]
    np.testing.assert_array_equal(sess.run(after), alone + 1.0)  # and again, after the next update
    np.testing.assert_array_equal(sess.run(before), alone + 1.0)  # a plain read: no update runs
    sends = [e for e in sess.parts.edges if e.tensor.name == "w:0"]
    assert sorted(e.after for e in sends) == [("w",), ("w", "upd")]


def test_a_read_after_an_update_through_a_third_device_sees_the_update() -> None:
    # The reader's control dependency is on a third device, and follows the update there: the value read must
    # still be the updated one, as on one device (it was sent right after w, so the worker read [0, 0]).
    third = "/job:worker/task:1/device:cpu:0"
    g = cg.Graph()
    with g.as_default():
        w = cg.variable(np.zeros(2, np.float32), name="w")
        upd = cg.assign_add(w, np.ones(2, np.float32), name="upd")
        done = cg.identity(cg.reduce_sum(upd, name="total"), name="done")
        with cg.control_dependencies([done]):
            after = cg.identity(w, name="after") * 1.0
    alone = cg.Session(g).run(after)
    placement = {n.name: PS if n.name in ("w", "upd") or n.name.startswith("const") else WORKER for n in g.nodes}
    placement.update(total=third, done=third)
    sess = cg.PartitionedSession(g, placement)
    np.testing.assert_array_equal(sess.run(after), alone)  # [1, 1]
    np.testing.assert_array_equal(sess.run(after), alone + 1.0)
    assert sorted(e.after for e in sess.parts.edges if e.tensor.name == "w:0" and e.dst == WORKER) == [("w", "upd")]


def test_a_read_ordered_after_a_node_that_reads_a_fed_placeholder_runs() -> None:
    # The walk up from the reader's control dependency (an update on a third device) reaches the fed placeholder
    # on the device of the value read: the Send waited for the placeholder node, and running it, unfed, raised.
    third = "/job:worker/task:1/device:cpu:0"
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((2,), name="x")
        v = cg.variable(np.ones(2, np.float32), name="v")
        u = cg.variable(np.zeros(2, np.float32), name="u")
        done = cg.reduce_sum(cg.assign_add(u, x * 2.0, name="upd"), name="done")
        with cg.control_dependencies([done]):
            after = cg.identity(v, name="after")
    placement = {n.name: third for n in g.nodes}
    placement.update(x=PS, v=PS, after=WORKER)
    sess, alone = cg.PartitionedSession(g, placement), cg.Session(g)
    for value in ([1.0, 2.0], [3.0, 4.0]):
        got, want = sess.run([after, done], {x: value}), alone.run([after, done], {x: value})
        np.testing.assert_array_equal(got[0], want[0])
        assert got[1] == want[1]
    assert [e.after for e in sess.parts.edges if e.tensor.name == "v:0"] == [("v",)]


DEVICES = [PS, WORKER, "/job:worker/task:1/device:cpu:0"]


def _random_stateful_graph(rng: np.random.Generator) -> tuple[cg.Graph, list[list[cg.Tensor]]]:
    """Variables, elementwise ops over them and a fed x, updates, and reads ordered after the updates."""
    g = cg.Graph()
    fetch_sets = []
    with g.as_default():
        x = cg.placeholder((3,), name="x")
        variables = [cg.variable(rng.normal(size=3).astype(np.float32), name=f"w{i}") for i in range(3)]
        pool = [x, *[cg.identity(v) * 1.0 for v in variables]]
        for _ in range(6):
            a, b = pool[rng.integers(len(pool))], pool[rng.integers(len(pool))]
            pool.append([a + b, a * b, cg.tanh(a) - b, cg.maximum(a, b)][rng.integers(4)])
        for j in range(3):
            variable = variables[rng.integers(3)]
            update = cg.assign_add(variable, pool[rng.integers(len(pool))] * 0.1, name=f"upd{j}")
            downstream = cg.reduce_sum(update) * 1.0
            with cg.control_dependencies([downstream.node if rng.random() < 0.5 else update]):
                fetch_sets.append([cg.identity(variable) * 2.0, downstream])
        fetch_sets.append([pool[-1], pool[-2]])
    return g, fetch_sets


@pytest.mark.parametrize("seed", range(30))
def test_random_graphs_with_state_give_a_sessions_numbers(seed: int) -> None:
    # Random placements over three devices, updates on their variable's device, reads ordered after updates
    # directly or through other devices' nodes; runs in a random order, each against a Session's.
    rng = np.random.default_rng(seed)
    g, fetch_sets = _random_stateful_graph(rng)
    placement = {n.name: DEVICES[rng.integers(3)] for n in g.nodes}
    for n in g.nodes:
        if n.op == "AssignAdd":
            placement[n.name] = placement[n.inputs[0].node.name]
    alone, parted = cg.Session(g), cg.PartitionedSession(g, placement)
    for i in rng.integers(len(fetch_sets), size=6):
        feed = {"x:0": rng.normal(size=3).astype(np.float32)}
        for want, got in zip(alone.run(fetch_sets[i], feed), parted.run(fetch_sets[i], feed), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_placement_missing_nodes_is_rejected() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((2,), name="x")
        cg.reduce_sum(x, name="total")
    with pytest.raises(cg.PlacementError, match=r"the placement gives no device for 'total'; place the graph again"):
        cg.partition(g, {"x": WORKER})


def test_a_recv_without_its_send_says_who_did_not_answer() -> None:
    g = cg.Graph()
    with g.as_default():
        w = cg.variable([1.0], name="w")
        y = cg.reduce_sum(w * 2.0, name="y")
    parts = cg.partition(g, {n.name: PS if n.name == "w" else WORKER for n in g.nodes}, timeout=0.2)
    worker = parts.graphs[WORKER]
    transport = cg.InProcessTransport()
    plan = cg.dataflow.executor.Plan(worker, [parts.copy_of(y)], [], [], VariableStore(), transport=transport)
    with pytest.raises(
        cg.ExecutionError,
        match=r"Recv 'recv/w_0-__job_worker_task_0_device_cpu_0' .*failed while running: ExecutionError: Recv of 'w:0->"
        + r"/job:worker/task:0/device:cpu:0': nothing was sent within 0.2 s \(waiting on /job:worker/task:0/device:cpu:0"
        + r" for /job:ps/task:0/device:cpu:0\)",
    ):
        unless_it_hangs(plan, HANG_S, "a Recv with a 0.2 s deadline and no Send")


def test_a_failing_partition_cancels_the_others_at_once() -> None:
    g = cg.Graph()
    with g.as_default():
        w = cg.variable(np.ones((3,), np.float32), name="w")
        a = cg.placeholder((None,), name="a")
        b = cg.placeholder((None,), name="b")
        grad = cg.reduce_sum(a + b) * w  # fails on the worker when a and b differ in length
        update = cg.assign_add(w, grad)
    placement = {n.name: PS if n.name in ("w", "assign_add") else WORKER for n in g.nodes}
    # The PS's Recv would wait an hour for the worker's gradient: only the cancellation can end the run.
    sess = cg.PartitionedSession(g, placement, timeout=3600.0)
    with pytest.raises(cg.ExecutionError, match=r"the partition on /job:worker/task:0/device:cpu:0 failed: Add 'add'"):
        unless_it_hangs(lambda: sess.run(update, {a: np.ones(2), b: np.ones(3)}), HANG_S, "the run after one failed")
    np.testing.assert_array_equal(sess.run(w), np.ones(3))  # and the PS applied nothing


def test_a_value_sent_after_a_cancel_never_reaches_the_next_run() -> None:
    transport = cg.InProcessTransport()
    transport.cancel("the partition on B failed")
    transport.send("y", np.ones(3, np.float32))  # a partition still running when B failed sends late
    with pytest.raises(cg.ExecutionError, match=r"Recv of 'y': the run was cancelled \(the partition on B failed\)"):
        transport.recv("y", 3600.0)  # at once, not after its deadline
    transport.reset()  # the run has ended: every partition stopped
    transport.send("y", np.full(3, 2.0, np.float32))
    np.testing.assert_array_equal(transport.recv("y", 1.0), np.full(3, 2.0, np.float32))  # the new run's own value


def test_the_run_after_a_failed_one_computes_from_its_own_values() -> None:
    """A's slow product reaches the Send after B has failed: before, that value waited in the transport, and
    the next run's Recv took it (about 1 run in 20 here returned the failed run's numbers, without a word)."""
    slow, fast = WORKER, "/job:worker/task:1/device:cpu:0"
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((200, 200), name="x")
        index = cg.placeholder((1,), dtype="int32", name="index")
        with cg.device(slow):
            y = cg.reduce_sum(cg.matmul(cg.matmul(x, x), x), axis=0, name="y")
        with cg.device(fast):
            picked = cg.reduce_sum(cg.gather(cg.constant(np.arange(4, dtype=np.float32)), index), name="picked")
            out = cg.add(y, picked, name="out")  # gather fails for index 9, before y arrives
    placement = {n.name: n.device or slow for n in g.nodes}
    placement["index"] = fast
    sess = cg.PartitionedSession(g, placement, timeout=60)
    rng = np.random.default_rng(0)
    for _ in range(5):
        with pytest.raises(cg.ExecutionError, match=r"the partition on /job:worker/task:1/device:cpu:0 failed"):
            sess.run(out, {x: rng.random((200, 200), dtype=np.float32), index: np.array([9], np.int32)})
        xb = rng.random((200, 200), dtype=np.float32)
        got = sess.run(out, {x: xb, index: np.array([3], np.int32)})
        np.testing.assert_allclose(got, (xb @ xb @ xb).sum(axis=0) + 3.0, rtol=1e-4)


class StallingLink(cg.InProcessTransport):
    """A link whose send of ``y`` stalls until the run is cancelled, as a send into a dead network would."""

    def __init__(self) -> None:
        super().__init__()
        self.stall = threading.Event()
        self.stalled = threading.Event()

    def send(self, key: str, value: np.ndarray) -> None:
        if key.startswith("y:") and not self.stall.is_set():
            self.stalled.set()
            self.stall.wait()  # until cancel() (the fix) or the test's watchdog (a hang)
            return
        super().send(key, value)

    def cancel(self, reason: str) -> None:
        self.stall.set()
        super().cancel(reason)


def test_an_interrupted_run_stops_its_partitions_and_leaves_nothing_for_the_next() -> None:
    """Ctrl-C in a notebook while a partition waits on another: the run stops at once, its Recv woken (it would
    wait out its hour), and the next run computes from its own values."""
    sender, receiver = WORKER, "/job:worker/task:1/device:cpu:0"
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((3,), name="x")
        with cg.device(sender):
            y = cg.mul(x, 2.0, name="y")
        with cg.device(receiver):
            out = cg.add(y, 1.0, name="out")
    link = StallingLink()
    sess = cg.PartitionedSession(g, {n.name: n.device or sender for n in g.nodes}, transport=link, timeout=3600.0)
    # A real SIGINT, as Jupyter's interrupt sends, to the main thread (where the run waits): it wakes a blocking
    # wait, which a simulated one (_thread.interrupt_main) does not.
    main = threading.main_thread().ident
    assert main is not None
    interrupt = threading.Thread(target=lambda: link.stalled.wait(HANG_S) and signal.pthread_kill(main, signal.SIGINT))
    fired: list[bool] = []
    watchdog = threading.Timer(HANG_S, lambda: (fired.append(True), link.cancel("the test's watchdog")))
    interrupt.start()
    watchdog.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            sess.run(out, {x: np.ones(3, np.float32)})
    finally:
        watchdog.cancel()
        interrupt.join(HANG_S)
    assert not fired, "the interrupt did not stop the run: the test's watchdog did"
    assert link._closed is None  # reset once the interrupted run's partitions stopped
    np.testing.assert_array_equal(sess.run(out, {x: np.full(3, 5.0, np.float32)}), np.full(3, 11.0, np.float32))


def test_a_run_after_an_interrupt_that_left_a_partition_running_waits_for_it_within_its_deadline() -> None:
    """A second Ctrl-C can cut the wait for an interrupted run's partitions short: the next run waits for them
    before it resets the transport, and says so when they outlive the session's deadline."""
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((3,), name="x")
        with cg.device("/job:worker/task:1/device:cpu:0"):
            y = cg.add(cg.mul(x, 2.0, name="twice"), 1.0, name="y")
    sess = cg.PartitionedSession(g, {n.name: n.device or WORKER for n in g.nodes}, timeout=0.05)
    still_running: concurrent.futures.Future[dict[str, object]] = concurrent.futures.Future()
    sess._unfinished = [still_running]
    with pytest.raises(
        cg.ExecutionError, match=r"1 partition\(s\) of an interrupted run are still running after 0.05 s"
    ):
        sess.run(y, {x: np.zeros(3, np.float32)})
    still_running.set_result({})  # it stopped: the next run starts afresh
    np.testing.assert_array_equal(sess.run(y, {x: np.ones(3, np.float32)}), np.full(3, 3.0, np.float32))


def test_send_and_recv_need_a_transport() -> None:
    g = cg.Graph()
    with g.as_default():
        w = cg.variable([1.0], name="w")
        cg.reduce_sum(w, name="y")
    parts = cg.partition(g, {"w": PS, "y": WORKER})
    recv = next(n for n in parts.graphs[WORKER].nodes if n.op == "Recv")
    with pytest.raises(
        cg.ExecutionError, match=r"needs a transport: run partitioned graphs with cg.PartitionedSession"
    ):
        recv.opdef.kernels["cpu"](recv, KernelContext(VariableStore()))


def test_mini_inception_placed_on_two_ps_tasks_trains_like_one_device() -> None:
    devices = ["/job:ps/task:0/device:cpu:0", "/job:ps/task:1/device:cpu:0", WORKER]
    losses = []
    for partitioned in (False, True):
        m = models.mini_inception(optimizer=cg.optim.Adam(1e-2))
        if partitioned:
            placement = cg.placement.place(m.graph, devices)
            assert set(placement.device_of.values()) == set(devices)
            sess = cg.PartitionedSession(m.graph, placement, timeout=20)
        else:
            sess = cg.Session(m.graph)
        losses.append([float(sess.run([m.train_op, m.loss], {m.x: xb, m.y: yb})[1]) for xb, yb in _batches(True)])
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)


GPU = "/job:worker/task:0/device:gpu:0"


@pytest.mark.cuda
def test_cpu_and_gpu_partitions_train_like_one_device() -> None:
    rng = np.random.default_rng(0)
    xb, yb = rng.random((4, 64), dtype=np.float32), np.array([0, 1, 2, 3], np.int32)
    losses = []
    for partitioned in (False, True):
        m = models.mlp(hidden=16, optimizer=cg.optim.SGD(0.1))
        if partitioned:
            placement = cg.placement.place(m.graph, [PS, WORKER, GPU])
            on_gpu = {placement.device_of[n.name] for n in m.graph.nodes if n.op == "MatMul"}
            assert on_gpu == {GPU}  # matmuls have CUDA kernels; ops without one moved to the CPU
            sess = cg.PartitionedSession(m.graph, placement, timeout=120)
        else:
            sess = cg.Session(m.graph)
        losses.append([float(sess.run([m.train_op, m.loss], {m.x: xb, m.y: yb})[1]) for _ in range(2)])
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-4)


@pytest.mark.cuda
def test_mini_inception_on_two_ps_tasks_and_a_gpu_worker_trains_like_one_device() -> None:
    """The devices issue's acceptance case. On the simulator it takes a few minutes
    (every CUDA thread is a Python thread), so the batch is two images, and the
    second run fetches only the loss: a second training step's update is never
    read, and its backward pass was two thirds of the simulator's time."""
    devices = ["/job:ps/task:0/device:cpu:0", "/job:ps/task:1/device:cpu:0", WORKER, GPU]
    rng = np.random.default_rng(0)
    xb, yb = rng.random((2, 8, 8, 1), dtype=np.float32), np.array([1, 7], np.int32)
    losses = []
    for partitioned in (False, True):
        m = models.mini_inception(optimizer=cg.optim.SGD(0.1))
        if partitioned:
            placement = cg.placement.place(m.graph, devices)
            load = placement.ps_load_bytes()
            assert max(load.values()) <= 1.1 * min(load.values())
            assert sum(1 for d in placement.device_of.values() if d == GPU) > len(placement.device_of) // 2
            sess = cg.PartitionedSession(m.graph, placement, timeout=600)
        else:
            sess = cg.Session(m.graph)
        # The loss before the step, then after it: the second reads the variables the GPU step updated.
        trained = float(sess.run([m.train_op, m.loss], {m.x: xb, m.y: yb})[1])
        losses.append([trained, float(sess.run(m.loss, {m.x: xb, m.y: yb}))])
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-4)


def test_bad_fetches_and_feeds_are_rejected_as_in_a_session() -> None:
    g = cg.Graph()
    with g.as_default():
        w = cg.variable([1.0], name="w")
        x = cg.placeholder((1,), name="x")
        step = cg.assign_add(w, x)
    other = cg.Graph()
    with other.as_default():
        z = cg.placeholder((1,), name="z")
    sess = cg.PartitionedSession(g, {"w": PS, "assign_add": PS, "x": WORKER})
    with pytest.raises(cg.GraphError, match=r"fetch 'z:0' is not in this session's graph"):
        sess.run(z)
    with pytest.raises(cg.GraphError, match=r"cannot fetch 42: fetch a Tensor, a node, or a name"):
        sess.run(42)
    with pytest.raises(cg.GraphError, match=r"feed 'z:0' is not in this session's graph"):
        sess.run(step, {z: [1.0]})
    with pytest.raises(
        cg.ShapeError, match=r"feed for 'x:0' \(test_partition\.py:\d+\) has shape \(2,\), expected \(1,\)"
    ):
        sess.run(step, {x: [1.0, 2.0]})
    np.testing.assert_array_equal(sess.run(w), [1.0])  # nothing rejected changed the variable
