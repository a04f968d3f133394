"""Write the example notebooks (``notebooks/*.ipynb``) from the cells below, outputs cleared.

The cells live here rather than only in the ``.ipynb`` files so that a change
reads as a plain diff and every notebook gets the same metadata and stable cell
ids (a regenerated notebook is byte for byte the same). Editing a notebook in
JupyterLab is fine too: copy the change back here before regenerating.

    python notebooks/make_notebooks.py          # write all five
    python notebooks/make_notebooks.py --check  # exit 1 if a notebook differs from what this file makes

``tests/notebook/test_notebooks.py`` runs each notebook top to bottom; cells
tagged ``run-twice`` are run a second time right away, as a person re-running
the cell would.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

import nbformat
from nbformat.notebooknode import NotebookNode

HERE = Path(__file__).resolve().parent
KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}


def md(text: str) -> tuple[str, str, list[str]]:
    return ("markdown", text, [])


def code(text: str, *tags: str) -> tuple[str, str, list[str]]:
    return ("code", text, list(tags))


QUICKSTART = [
    md("""
    # 1. Quick start: a graph in cells, a training step, a cell run again

    You will build a small neural network (a multi-layer perceptron) for the 8x8 handwritten digits, look at its
    graph, train it in this process, and then run one of its cells again, the thing that used to break
    notebooks built on graph frameworks.

    `%load_ext cellgraph` wraps every cell that follows in a *cell scope*: each node the cell makes remembers
    the cell. Running the cell again replaces those nodes instead of adding `dense_1`, `dense_2`, … next to
    them (TensorFlow 1's default-graph trap, which sent everyone to `reset_default_graph()`).
    """),
    code("""
    %load_ext cellgraph

    import numpy as np

    import cellgraph as cg
    from cellgraph.examples import digits
    """),
    md("""
    ## The data

    scikit-learn's bundled digits: 1,797 images of 8x8 pixels, flattened to 64 values in [0, 1], with a fixed
    80/20 train/test split. It ships inside scikit-learn, so nothing is downloaded.
    """),
    code("""
    data = digits.load()
    print(f"train {data.x_train.shape} {data.x_train.dtype}, test {data.x_test.shape}, labels {data.y_train[:10]}")
    """),
    md("""
    ## Building the graph in `%%graph` cells

    A `%%graph` cell runs as usual, with the default graph as the one the ops go into. A placeholder is an input
    that is fed when the graph runs; `None` in a shape means "any size" (the batch). Shapes and dtypes are checked
    as each op is made, so a mistake fails here, naming the op, the cell and the line, not later inside a kernel.

    `--no-show` skips the graph drawing for this small cell.
    """),
    code("""
    %%graph --no-show
    x = cg.placeholder((None, 64), "float32", name="x")
    y = cg.placeholder((None,), "int32", name="y")
    """),
    md("""
    The model: a hidden layer of 128 ReLU units and an output layer of 10 logits, one per digit. Each
    `cg.layers.dense` makes a name scope (`hidden/…`) holding its kernel and bias variables and its ops.

    At the end of the cell the graph is drawn: scopes start collapsed; click one to open it, click a node to see
    its shapes and the cell that made it. This is the cell you will run again below.
    """),
    code(
        """
    %%graph
    hidden = cg.layers.dense(x, 128, activation="relu", name="hidden")
    logits = cg.layers.dense(hidden, 10, name="logits")
    """,
        "run-twice",
    ),
    md("""
    The loss (softmax cross-entropy against the labels), an accuracy to watch, and the training op:
    `Adam(...).minimize(loss)` adds the backward graph (`cg.gradients`) and one `ApplyAdam` op per variable.
    Optimizer updates are ops so that, in a cluster, each runs where its variable lives (on a parameter server).
    """),
    code("""
    %%graph
    loss = cg.losses.sparse_softmax_cross_entropy(logits, y)
    accuracy = cg.metrics.accuracy(logits, y)
    train_op = cg.optim.Adam(1e-2).minimize(loss)
    """),
    md("""
    ## A training step, here in the kernel

    A `cg.Session` runs parts of a graph and owns its variables' values. `make_callable` compiles the fetches
    once into a plan and returns it: the loop below calls the compiled code directly. One pass over the training
    data in batches of 64 is an epoch; five are plenty for this model.
    """),
    code("""
    sess = cg.Session()  # the default graph, which the %%graph cells built
    test = {x: data.x_test, y: data.y_test}
    print(f"before training: loss {sess.run(loss, test):.3f}, test accuracy {sess.run(accuracy, test):.1%}")

    step = sess.make_callable([train_op, loss], [x, y])
    rng = np.random.default_rng(0)
    for epoch in range(5):
        order = rng.permutation(len(data.x_train))
        for start in range(0, len(order) - 63, 64):
            batch = order[start : start + 64]
            (batch_loss,) = step(data.x_train[batch], data.y_train[batch])  # train_op is a node: no value
        print(f"epoch {epoch + 1}: last batch loss {float(batch_loss):.3f}")

    trained_accuracy = sess.run(accuracy, test)
    print(f"after training: test accuracy {trained_accuracy:.1%}")
    """),
    md("""
    ## Running a cell again

    Go back to the model cell (`hidden = cg.layers.dense(...)`) and run it again (Shift+Enter), then run the
    cells below. (The notebook's test does exactly that: it runs that cell twice.)

    Its nodes are replaced under the same names: no `hidden_1`, no second copy of the layer. The loss cell's ops,
    which read `logits`, are re-bound to the new nodes, and the variables keep their trained values because their
    shapes did not change. Edit 128 to 64 instead, and the hidden layer's variables start afresh (with a warning),
    while the loss cell's gradient ops, which no longer fit, are marked stale: the next run says which cell to
    run again.
    """),
    code("""
    graph = cg.get_default_graph()
    names = [node.name for node in graph.nodes]
    layers = sorted({name.split("/")[0] for name in names if name.startswith(("hidden", "logits"))})
    print(f"{len(names)} nodes; layer scopes: {layers}")
    kernel = graph.node("hidden/kernel")
    print(f"hidden/kernel was made by cell {kernel.cell_label}, line {kernel.line}")
    assert layers == ["hidden", "logits"], layers  # no hidden_1, logits_1

    after = sess.run(accuracy, test)
    print(f"test accuracy after the re-run: {after:.1%} (before it: {trained_accuracy:.1%})")
    """),
    md("""
    ## What the extension does for you

    Under the hood, each cell runs inside `cg.cell_scope(cell_id)`, with the id JupyterLab (or Notebook 7, or
    VS Code) sends with the cell. The same thing by hand, outside any notebook: three runs of one "cell" leave one
    layer.
    """),
    code("""
    by_hand = cg.Graph()
    with by_hand.as_default():
        for run in range(3):  # the same cell, executed three times
            with cg.cell_scope("cell-1", label=str(run + 1)):
                inputs = cg.placeholder((None, 4), name="inputs")
                cg.layers.dense(inputs, 8, name="layer")
    print([node.name for node in by_hand.nodes])
    """),
    md("""
    Next: `02_devices_and_placement` shows where each of these ops would run in a cluster.
    """),
]


PLACEMENT = [
    md("""
    # 2. Devices, placement, partitions and fusion

    Before anything runs in a cluster, every op of a graph gets a device. This notebook shows how devices are
    named, how cellgraph chooses one for each op (and why, in words), what the graph looks like once it is cut
    into one piece per device, and how runs of elementwise ops are fused into a single loop. Everything here runs
    in this process: no cluster is needed to look at a placement.
    """),
    code("""
    import time

    import numpy as np

    import cellgraph as cg
    from cellgraph.examples import digits, models
    from cellgraph.widgets import GraphView
    """),
    md("""
    ## Device names

    A device is named as in TensorFlow: `/job:<ps|worker>/task:<i>/device:<cpu|gpu>:<k>`. `ps` tasks are
    parameter servers, which hold the variables; `worker` tasks compute. Every part is optional inside a
    `with cg.device(...)` scope, and nested scopes merge, the inner one filling in what it names.
    """),
    code("""
    print(repr(cg.DeviceSpec.parse("/job:worker/task:1/device:gpu:0")))

    g = cg.Graph()
    with g.as_default():
        with cg.device("/job:worker/task:1"):
            a = cg.placeholder((2,), name="a")
            with cg.device("/device:cpu:0"):
                b = a * 2.0
    print(f"a asked for {a.node.device!r}, b for {b.node.device!r}")
    """),
    md("""
    ## Placing a graph

    `cg.placement.place(graph, devices)` gives every node a device without changing the graph, so you can look
    at the result first. The rules, in order: an explicit `cg.device` scope wins; variables (and their optimizer
    slots, and the ops that update them) go to `ps` tasks; gradient ops stay with their forward ops; everything
    else goes to the first worker.

    Here: the MLP from the quick start on two parameter servers and one worker. `print(placement)` is the table,
    with the reason for each node. The hidden layer's kernel is larger than a fair share of the variable bytes, so
    it is split by rows across both servers.
    """),
    code("""
    mlp = models.mlp()
    devices = ["/job:ps/task:0/device:cpu:0", "/job:ps/task:1/device:cpu:0", "/job:worker/task:0/device:cpu:0"]
    placement = cg.placement.place(mlp.graph, devices)
    print(placement)
    """),
    md("""
    The same placement, drawn: nodes are coloured by device, and edges between devices (which become Send/Recv
    pairs) are marked. Click a node to see why it was placed where it is.
    """),
    code("""
    GraphView(mlp.graph, placement)
    """),
    md("""
    ## Placement strategies and parameter-server load

    How variables spread over the `ps` tasks matters: the task holding most bytes serves most traffic every
    step, and the others wait for it. TensorFlow's `replica_device_setter` deals variables round-robin in graph
    order, whatever their size, which overloads one server (tensorflow#24953). cellgraph's default, `greedy`,
    puts the largest variables first onto the least-loaded task, and splits a variable larger than its fair
    share. `placement.ps_load_bytes()` is the bytes each task holds. The mini-Inception CNN shows the difference:
    """),
    code("""
    inception = models.mini_inception()
    no_split = 10**9  # split_threshold_bytes: never split, to compare the strategies alone
    for strategy, threshold in [("round_robin", no_split), ("greedy", no_split), ("greedy", None)]:
        load = cg.placement.place(inception.graph, devices, strategy=strategy, split_threshold_bytes=threshold)
        load = load.ps_load_bytes()
        split = "split allowed" if threshold is None else "no split"
        shown = ", ".join(f"task {cg.DeviceSpec.parse(device).task}: {nbytes:,} B" for device, nbytes in load.items())
        print(f"{strategy:12} ({split:13}): {shown}; busiest / lightest {max(load.values()) / min(load.values()):.1f}x")
    """),
    md("""
    ## Partitions: one graph per device

    `cg.partition(graph, placement)` cuts the placed graph into one subgraph per device. Wherever a tensor
    crosses devices, a `Send` on one side and a `Recv` on the other carry it: one pair per tensor per
    destination device. In a cluster a Send/Recv to a parameter server is a gRPC pull or push; inside one
    process, between CPU and GPU, it is a device copy.
    """),
    code("""
    parts = cg.partition(mlp.graph, placement)
    for device, subgraph in parts.graphs.items():
        ops = [node.op for node in subgraph.nodes]
        print(f"{device}: {len(ops)} nodes, {ops.count('Send')} Send, {ops.count('Recv')} Recv")
    for edge in parts.edges[:4]:
        print(f"  {edge.tensor.name} goes from {edge.src} to {edge.dst}")
    print(f"  ... {len(parts.edges)} tensors cross devices in all")
    """),
    md("""
    `cg.PartitionedSession` runs the partitions concurrently in this one process, each device's piece as its own
    compiled plan, with the Send/Recv pairs meeting in an in-process transport. It must train exactly like a
    plain `cg.Session` on one device: the same losses, step after step.
    """),
    code("""
    data = digits.load()
    batch = {mlp.x: data.x_train[:64], mlp.y: data.y_train[:64]}
    one_device = cg.Session(mlp.graph)
    partitioned = cg.PartitionedSession(mlp.graph, placement)
    for step in range(3):
        _, plain_loss = one_device.run([mlp.train_op, mlp.loss], batch)
        _, split_loss = partitioned.run([mlp.train_op, mlp.loss], batch)
        print(f"step {step}: one device {float(plain_loss):.6f}, partitioned {float(split_loss):.6f}")
        np.testing.assert_allclose(split_loss, plain_loss, rtol=1e-5)
    """),
    md("""
    ## Fusion: a chain of elementwise ops as one loop

    Run one by one, each elementwise op (`*`, `+`, `relu`, `tanh`, …) reads its inputs from memory and writes a
    new array. The executor fuses a run of them into one generated Numba loop that reads each input once and
    writes one output, with no intermediate arrays. `Session(graph, fuse=False)` turns that off, for comparison.
    The plan that `make_callable` returns shows its steps: a fused run is one step holding several nodes.
    """),
    code("""
    size = 1_000_000
    chain = cg.Graph()
    with chain.as_default():
        u = cg.placeholder((size,), name="u")
        v = cg.placeholder((size,), name="v")
        out = cg.maximum(cg.tanh(cg.relu(u * 0.5 + v) - 0.25) * v, -0.5) + 1.0  # 8 elementwise ops

    rng = np.random.default_rng(0)
    u_value, v_value = rng.standard_normal((2, size), dtype=np.float32)
    results, timings = {}, {}
    for fuse in (True, False):
        plan = cg.Session(chain, fuse=fuse).make_callable([out], [u, v])
        (results[fuse],) = plan(u_value, v_value)  # the first call compiles
        began = time.perf_counter()
        for _ in range(5):
            plan(u_value, v_value)
        timings[fuse] = (time.perf_counter() - began) / 5
        kernels = [len(step.nodes) for step in plan.steps if not step.constant]
        print(f"fuse={fuse!s:5}: {len(kernels)} kernel call(s) of {kernels} node(s), {timings[fuse] * 1e3:.1f} ms")
    np.testing.assert_allclose(results[True], results[False], rtol=1e-6)
    print(f"fused is {timings[False] / timings[True]:.1f}x faster here, with the same result")
    """),
    md("""
    Next: `03_distributed_training` runs a placement like this one for real, on a Dask cluster.
    """),
]


DISTRIBUTED = [
    md("""
    # 3. Distributed training from the notebook

    A local Dask cluster (one parameter-server process and two training processes on this machine), a job
    launched from a cell, watched while it trains, stopped, scaled, evaluated and checkpointed, all without
    leaving the notebook. The same cells work on any Dask cluster: `%cluster connect tcp://host:8786` instead of
    `%cluster up`.

    Every wait below has a deadline, so a cell never hangs: if something does not answer, the cell says what.
    """),
    code("""
    %load_ext cellgraph

    import asyncio
    import time

    import cellgraph as cg
    from cellgraph.examples import digits

    data = digits.load()
    x_train, y_train = data.x_train, data.y_train
    """),
    md("""
    ## The model

    The MLP of the quick start, built into a graph named `mlp` (`%%graph mlp`), which `%placement mlp` refers to
    below.
    """),
    code("""
    %%graph mlp --no-show
    x = cg.placeholder((None, 64), "float32", name="x")
    y = cg.placeholder((None,), "int32", name="y")
    hidden = cg.layers.dense(x, 128, activation="relu", name="hidden")
    logits = cg.layers.dense(hidden, 10, name="logits")
    loss = cg.losses.sparse_softmax_cross_entropy(logits, y)
    accuracy = cg.metrics.accuracy(logits, y)
    """),
    md("""
    ## A cluster

    `%cluster up` starts a `distributed.LocalCluster` bound to 127.0.0.1: worker processes with the role `ps`
    (they will host the parameter servers) or `worker` (they run the replicas). It is bound to `cluster` in the
    notebook and shown with its workers and the Dask dashboard link.
    """),
    code("""
    %cluster up --workers 2 --ps 1
    """),
    md("""
    `%placement mlp` places the graph on this cluster's devices: the variables on the parameter server, the
    computation on the first worker. The drawing is coloured by device; the table says why each node went where.
    """),
    code("""
    %placement mlp
    """),
    md("""
    ## Training

    `%train` hands the loss to the cluster and returns at once: the graph travels to the workers as a `GraphDef`
    (data with a schema, not pickled code), the training rows are split into one shard per replica, and each
    replica runs as a long-lived task. In `sync` mode every global step averages both replicas' gradients.
    The job is bound to `job`, and its monitor (loss curve, progress, step rate per replica, parameter-server
    load, events, Stop and Scale buttons) updates by itself.

    `--steps 100000` is more than this notebook will wait for: the job is stopped below.
    """),
    code("""
    %train loss --data x_train,y_train --replicas 2 --steps 100000 --mode sync --optimizer adam:1e-2 --batch-size 32
    """),
    md("""
    ## Watching it

    The kernel is free while the job trains: this cell waits for 150 global steps, with a deadline. It waits with
    `await asyncio.sleep`, not `time.sleep`, so that the monitor above keeps drawing meanwhile (widgets update
    from the kernel's event loop, which a blocking sleep would hold up).
    """),
    code("""
    # Waits for condition() to hold, at most timeout seconds, letting the widgets draw meanwhile.
    async def wait_until(condition, what, timeout=120):
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not within {timeout} s; the job's events: {job.events}")
            await asyncio.sleep(0.25)


    await wait_until(lambda: job.global_step() >= 150, "150 global steps")
    print(f"{job.status} at global step {job.global_step()}; the latest metrics message:")
    print({key: value for key, value in job.metrics[-1].items() if key in ("replica", "step", "loss", "examples_per_s")})
    """),
    md("""
    ## Stopping it

    `job.stop()` lets each replica finish its step, then writes a final checkpoint (the Stop button does the
    same). The trained variables stay on the parameter servers, so the job can still be evaluated:
    `job.evaluate` pulls them into this process and runs the accuracy on the test set.
    """),
    code("""
    job.stop(timeout=60)
    print(f"status: {job.status}, global step {job.global_step()}")
    test_accuracy = job.evaluate(accuracy, {x: data.x_test, y: data.y_test})
    print(f"test accuracy {test_accuracy:.1%}")
    for event in job.events[-3:]:
        print(event)
    """),
    md("""
    ## Checkpoints

    The parameter servers checkpoint by themselves every `--checkpoint-every` global steps (100 by default),
    each shard writing its variables, optimizer slots and global step as safetensors plus a JSON manifest. A lost
    parameter server is restarted from the newest one, and `cg.train(..., resume_from=name,
    checkpoint_dir=...)` starts a new job from one.
    """),
    code("""
    print(f"checkpoints: {job.checkpoints}")
    latest = job.checkpoint_dir / job.checkpoints[-1]
    print(f"the latest, {latest}, holds:")
    for path in sorted(latest.iterdir()):
        print(f"  {path.name}: {path.stat().st_size:,} bytes")
    """),
    md("""
    ## Scaling a job while it runs

    A new job, on one replica this time. `job.scale(2)` adds a second replica while it trains: the newcomer gets
    half of the rows, loads the graph, joins at the servers' current global step, and from then on each step
    takes both gradients. (`%cluster scale N` changes the number of training processes, for more replicas than
    processes.) Again the job has more steps than the notebook waits for: it is stopped once both replicas have
    trained together for a while.
    """),
    code("""
    %train loss --data x_train,y_train --replicas 1 --steps 100000 --mode sync --optimizer adam:1e-2 --batch-size 32 --checkpoint-every 500
    """),
    code("""
    await wait_until(lambda: job.global_step() >= 20, "20 global steps")
    job.scale(2)
    print(f"{job.replicas} replicas from global step {job.global_step()}")
    await wait_until(lambda: any("replica(s) 1 joined" in event for event in job.events), "replica 1 joining")
    joined_at = job.global_step()
    # Metrics messages come from each replica every half second: wait for replica 1 to report 50 more steps.
    await wait_until(
        lambda: any(m["replica"] == 1 and m["step"] >= joined_at + 50 for m in job.metrics), "replica 1 training"
    )
    last_step = {message["replica"]: message["step"] for message in job.metrics}  # the latest report of each
    print(f"replica 1 joined by global step {joined_at}; latest steps reported by replica: {last_step}")
    """),
    md("""
    Stopped again, and evaluated; the events tell the job's story.
    """),
    code("""
    job.stop(timeout=60)
    print(f"status: {job.status}, global step {job.global_step()}")
    print(f"test accuracy {job.evaluate(accuracy, {x: data.x_test, y: data.y_test}):.1%}")
    for event in job.events:
        print(event)
    """),
    md("""
    ## Shutting down

    `%cluster down` closes the jobs started on the cluster, then the cluster and all its processes. (Restarting
    or shutting down the kernel does too.)
    """),
    code("""
    %cluster down
    """),
]


INCEPTION = [
    md("""
    # 4. Mini-Inception, synchronous training with a backup worker, and a worker killed mid-run

    In synchronous training every global step waits for the replicas' gradients, so one slow or dead machine
    would hold everyone up. TensorFlow's answer (SyncReplicasOptimizer) was *backup workers*: run `n` replicas
    but apply each step with the first `k < n` gradients that arrive, and drop the late ones as stale.

    Here: three replicas, two gradients per step. Mid-run we kill one training worker's process outright
    (SIGKILL, as a crashed machine would go). The other two keep training meanwhile; the cluster restarts the
    process, the job submits the lost replica again, and it rejoins at the servers' global step.
    """),
    code("""
    %load_ext cellgraph

    import asyncio
    import os
    import signal
    import time

    import cellgraph as cg
    from cellgraph.examples import digits, models

    data = digits.load()
    x_train, y_train = data.images(data.x_train), data.y_train  # (N, 8, 8, 1): NHWC images for the CNN
    x_test, y_test = data.images(data.x_test), data.y_test
    """),
    md("""
    ## The model

    A mini-Inception: a 3x3 convolution stem, one Inception block (parallel 1x1, 3x3, 5x5 and pooling branches,
    concatenated on channels), a 2x2 max pool and a dense head. Click the `inception` scope to open the block.
    """),
    code("""
    model = models.mini_inception(optimizer=cg.optim.Adam(3e-3))
    model.graph
    """),
    code("""
    %cluster up --workers 3 --ps 1
    """),
    md("""
    ## Training with a backup worker

    `--replicas 3 --replicas-to-aggregate 2`: each global step averages the first two gradients computed at that
    step; the third replica is a backup.
    """),
    code("""
    %train model.loss --data x_train,y_train --replicas 3 --replicas-to-aggregate 2 --steps 300 --mode sync --optimizer adam:3e-3 --batch-size 32
    """),
    md("""
    Wait for the job to be well under way (with a deadline, and awaiting, so the monitor keeps drawing).
    """),
    code("""
    async def wait_for_step(step, timeout=120):
        deadline = time.monotonic() + timeout
        while job.global_step() < step:
            if job.status != "running":
                raise RuntimeError(f"the job is {job.status}: {job.events}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"below step {step} after {timeout} s; the job's events: {job.events}")
            await asyncio.sleep(0.2)


    await wait_for_step(40)
    print(f"global step {job.global_step()}; {job.events[0]}")
    """),
    md("""
    ## Killing a training worker

    `cg.train` starts replica `i` on the `i`-th training worker, so replica 1 runs on the second one. Dask runs
    `os.getpid` there to tell us its process id, and we kill that process. Its nanny (the process that watches
    it) starts a fresh one.
    """),
    code("""
    victim = cluster.training_workers()[1]
    pid = cluster.client.run(os.getpid, workers=[victim])[victim]
    killed_at_step = job.global_step()
    os.kill(pid, signal.SIGKILL)
    print(f"killed worker {victim} (pid {pid}) at global step {killed_at_step}")
    """),
    md("""
    ## Watching the job survive

    The job notices the lost worker, says so in its events, and runs replica 1 again on a live training
    worker. Meanwhile the two other replicas make every step on their own: that is what the backup was for.
    """),
    code("""
    deadline = time.monotonic() + 120
    while not any("lost worker" in event for event in job.events):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the lost worker was not reported within 120 s: {job.events}")
        await asyncio.sleep(0.2)
    await wait_for_step(killed_at_step + 30)
    print(f"global step {job.global_step()}: the job trained on through the loss")
    """),
    code("""
    job.wait(timeout=180)
    print(f"status: {job.status}, global step {job.global_step()} of {job.steps}")
    for event in job.events:
        print(event)
    """),
    md("""
    ## How good is it?

    The trained variables come from the parameter servers; the accuracy runs here on the held-out images.
    """),
    code("""
    test_accuracy = job.evaluate(model.accuracy, {model.x: x_test, model.y: y_test})
    print(f"test accuracy {test_accuracy:.1%} after {job.global_step()} steps, one worker lost on the way")
    """),
    code("""
    %cluster down
    """),
]


KERNELS = [
    md("""
    # 5. Kernels: CPU and CUDA

    Every op has a CPU kernel (Numba `@njit`) and a CUDA kernel (Numba `@cuda.jit`) beside it, in one registry
    entry. This notebook runs the same small graph on both and checks that they agree, then looks at a fused
    chain of elementwise ops, which on a GPU becomes one generated CUDA kernel.

    **No GPU?** Numba's CUDA *simulator* runs CUDA kernels as plain Python, one Python thread per CUDA thread:
    the same code paths, checked without a GPU, but slow, so the shapes here are tiny. It is switched on by the
    environment variable `NUMBA_ENABLE_CUDASIM=1`, which Numba reads into its settings when it is imported, and
    `numba.cuda` consults once, when it is first imported, to choose between the simulator and a GPU for the
    rest of the process. So the first cell sets it before anything imports `numba.cuda`. (`import cellgraph`
    imports Numba but not `numba.cuda`, which waits for the first CUDA kernel; if Numba is loaded already, as
    in the "Python 3 (cellgraph)" kernel, the cell has it read its settings again.)
    """),
    code("""
    import os
    import shutil
    import sys

    if shutil.which("nvidia-smi") is None:  # no NVIDIA driver here: use the simulator
        if "numba.cuda" in sys.modules and os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
            raise RuntimeError("numba.cuda was imported without the simulator: restart the kernel, run this cell first")
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
        if "numba" in sys.modules:  # loaded before this cell: read the variable into its settings now
            from numba.core import config

            config.reload_config()
    print("CUDA simulator" if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" else "a real GPU")
    """),
    code("""
    import numpy as np
    from numba import cuda  # the simulator or a real GPU: whichever the cell above chose

    import cellgraph as cg
    from cellgraph.dataflow.executor import Plan
    from cellgraph.dataflow.kernels import cuda as cuda_kernels
    from cellgraph.dataflow.variables import VariableStore

    print(f"CUDA kernels can run: {cuda_kernels.available()} (simulator: {cuda_kernels.simulator()})")
    CPU = "/job:worker/task:0/device:cpu:0"
    GPU = "/job:worker/task:0/device:gpu:0"
    """),
    md("""
    ## One op, two kernels

    An op's registry entry (its `OpDef`) holds its shape rule, a NumPy reference, its gradient rule, and its
    kernels keyed by device. Placement reads it: an op with no kernel for the device asked would move to the
    CPU, with the reason recorded.
    """),
    code("""
    small = cg.Graph()
    with small.as_default():
        with cg.device("/device:cpu:0"):  # the input and the weights live in host memory
            x = cg.placeholder((4, 8), name="x")
            w = cg.variable(np.random.default_rng(0).standard_normal((8, 3)).astype(np.float32), name="w")
        with cg.device("/device:gpu:0"):  # the computation on the GPU
            h = cg.relu(x @ w, name="h")
            probabilities = cg.softmax(h, name="probabilities")
    for node in small.nodes:
        print(f"{node.name:14} {node.op:12} kernels: {sorted(node.opdef.kernels)}")
    """),
    md("""
    Placed on a CPU and a GPU as the `cg.device` scopes ask, the graph is cut in two: `x` and `w` cross to the
    GPU through Send/Recv pairs (host-to-device copies), the matmul, ReLU and softmax run there with their CUDA
    kernels, and intermediate tensors stay in device memory. A `PartitionedSession` runs both partitions; a plain
    `Session` runs the whole graph with the CPU kernels. They must agree.
    """),
    code("""
    placement = cg.placement.place(small, [CPU, GPU])
    print(placement)
    for edge in cg.partition(small, placement).edges:
        print(f"Send/Recv: {edge.tensor.name} from {edge.src} to {edge.dst}")

    x_value = np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32)
    on_cpu = cg.Session(small).run(probabilities, {x: x_value})
    on_gpu = cg.PartitionedSession(small, placement).run(probabilities, {x: x_value})
    print(f"largest difference between the CPU and CUDA kernels: {np.abs(on_cpu - on_gpu).max():.2e}")
    np.testing.assert_allclose(on_gpu, on_cpu, rtol=1e-5, atol=1e-6)
    """),
    md("""
    ## A fused chain on the GPU

    On a GPU a run of elementwise ops is fused into one generated CUDA kernel: one launch, each input read once,
    no intermediate arrays in device memory. Below, the executor's plan for the chain on the CUDA device, fused
    and not: the fused plan has one step for the whole chain. Both give the CPU's answer.
    """),
    code("""
    chain = cg.Graph()
    with chain.as_default():
        a = cg.placeholder((64,), name="a")
        b = cg.placeholder((64,), name="b")
        out = cg.maximum(cg.tanh(cg.relu(a * 0.5 + b) - 0.25) * b, -0.5) + 1.0  # 8 elementwise ops

    a_value, b_value = np.random.default_rng(2).standard_normal((2, 64)).astype(np.float32)
    expected = cg.Session(chain, fuse=False).run(out, {a: a_value, b: b_value})  # CPU kernels, one by one
    for fuse in (True, False):
        plan = Plan(chain, [out], [], [a, b], VariableStore(), device="cuda", fuse=fuse)
        (result,) = plan(cuda.to_device(a_value), cuda.to_device(b_value))
        kernels = [len(step.nodes) for step in plan.steps if not step.constant]
        print(f"fuse={fuse!s:5}: {len(kernels)} CUDA kernel launch(es) of {kernels} node(s)")
        np.testing.assert_allclose(result.copy_to_host(), expected, rtol=1e-5, atol=1e-6)
    print("fused and unfused CUDA plans match the CPU kernels")
    """),
    md("""
    The same check runs for every op in the test suite (`NUMBA_ENABLE_CUDASIM=1 pytest -m cuda`), and
    `python benchmarks/gpu_kernels.py` measures the CUDA kernels on a real GPU.
    """),
]


NOTEBOOKS = {
    "01_quickstart": QUICKSTART,
    "02_devices_and_placement": PLACEMENT,
    "03_distributed_training": DISTRIBUTED,
    "04_inception_sync_backup": INCEPTION,
    "05_kernels": KERNELS,
}


def build(stem: str, cells: list[tuple[str, str, list[str]]]) -> NotebookNode:
    """The notebook ``stem``: its cells with stable ids, no outputs, no execution counts."""
    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": KERNELSPEC, "language_info": {"name": "python"}}
    for i, (kind, text, tags) in enumerate(cells):
        source = textwrap.dedent(text).strip("\n")
        cell = nbformat.v4.new_markdown_cell(source) if kind == "markdown" else nbformat.v4.new_code_cell(source)
        cell.id = f"{stem[:2]}-{i:02d}"
        if tags:
            cell.metadata["tags"] = tags
        nb.cells.append(cell)
    nbformat.validate(nb)
    return nb


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 on a difference")
    args = parser.parse_args(argv)
    differ = []
    for stem, cells in NOTEBOOKS.items():
        path = HERE / f"{stem}.ipynb"
        text = nbformat.writes(build(stem, cells)) + "\n"
        if args.check:
            if not path.exists() or path.read_text() != text:
                differ.append(path.name)
        else:
            path.write_text(text)
    if differ:
        print(f"differ from make_notebooks.py: {', '.join(differ)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
