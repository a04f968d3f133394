"""Bad arguments to %train, %cluster and %placement: the problem and the usage, no traceback, nothing changed."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell

import cellgraph as cg
from cellgraph.cluster.cluster import Cluster
from cellgraph.cluster.reach import unreachable
from cellgraph.kernel_ext.arguments import optimizer
from cellgraph.kernel_ext.extension import extension_of
from cellgraph.kernel_ext.magics_train import resume_point

from .shells import ok, refused

MODEL = (
    "import cellgraph as cg\nimport numpy as np\n"
    "x = cg.placeholder((None, 4), name='x')\ny = cg.placeholder((None,), 'int32', name='y')\n"
    "loss = cg.losses.sparse_softmax_cross_entropy(cg.layers.dense(x, 3, name='logits'), y)\n"
    "X = np.zeros((8, 4), np.float32)\nY = np.zeros(8, np.int32)\nn = 3\n"
    "from cellgraph.examples.digits import Split\nsplit = Split(X, Y, X, Y)"
)


def user_values(shell: InteractiveShell) -> dict[str, int]:
    """The notebook's own names (not IPython's history ones, ``_i3``, ``Out``) and the identity of each value."""
    return {
        k: id(v) for k, v in shell.user_ns.items() if not k.startswith("_") and k not in ("In", "Out", "exit", "quit")
    }


HANG_GUARD_S = 20.0  # a wait that must never be reached; not a measure of speed

TRAIN_USAGE = "usage: %train [-h] [--data X,y] [--replicas REPLICAS]"

TRAIN_CASES = [
    ("%train loss --data X,Y --bogus 1", "%train: unrecognized arguments: --bogus 1"),
    ("%train", "%train: the following arguments are required: LOSS"),
    ("%train loss --data X,Y --steps many", "%train: argument --steps: expected an integer of 0 or more, got 'many'"),
    ("%train loss --data X,Y --replicas 0", "%train: argument --replicas: expected a positive integer, got '0'"),
    (
        "%train loss --data X,Y --mode fast",
        "%train: argument --mode: invalid choice: 'fast' (choose from 'sync', 'async')",
    ),
    (
        "%train losss --data X,Y",
        "%train: LOSS 'losss' is not defined in the notebook: run the cell that makes losss first",
    ),
    ("%train loss.grad --data X,Y", "%train: LOSS 'loss.grad': loss (a Tensor) has no attribute 'grad'"),
    (
        "%train 'loss + 1' --data X,Y",
        "%train: LOSS 'loss + 1' is not a name: give a variable of the notebook, or an attribute path such as "
        "model.loss (a magic evaluates no code: bind the value to a name in a cell first)",
    ),
    (  # split at the slice's comma, it said "--data 'X[:' is not a name"
        "%train loss --data X[:,:10],Y",
        "%train: --data 'X[:,:10],Y' is code, not names: %train looks the arrays up by name and evaluates nothing; "
        "bind them to names in a cell first (x_part = x_train[:100]), then --data x_part,...",
    ),
    (  # digits.load()'s split, given whole: it said "data has 1 array(s) but the loss needs 2 placeholder(s)"
        "%train loss --data split",
        "%train: --data 'split' is a Split holding arrays, not an array: name the arrays, from split.x_train, "
        "split.y_train, split.x_test, split.y_test (e.g. --data split.x_train,split.y_train)",
    ),
    (
        "%train loss --data X,Y-1",
        "%train: --data 'Y-1' is not a name: give a variable of the notebook, or an attribute path such as "
        "data.x_train (a magic evaluates no code: bind the value to a name in a cell first)",
    ),
    ("%train n --data X,Y", "%train: LOSS 'n' is a int, not a cg.Tensor"),
    ("%train loss", "%train: --data is missing: name the training arrays, e.g. --data x_train,y_train"),
    ("%train loss --data X,Z", "%train: --data 'Z' is not defined in the notebook: run the cell that makes Z first"),
    (
        "%train loss --data X,Y --optimizer lamb:1e-3",
        "%train: --optimizer 'lamb:1e-3': unknown optimizer 'lamb'; known: adadelta, adagrad, adam, adamax, adamw, momentum, nadam, rmsprop, sgd (e.g. adam:1e-3)",
    ),
    (  # a typo of a new kind: the list said it, not which one was meant
        "%train loss --data X,Y --optimizer nadm:1e-3",
        "%train: --optimizer 'nadm:1e-3': unknown optimizer 'nadm', did you mean 'nadam'? known: adadelta, adagrad, adam, adamax, adamw, momentum, nadam, rmsprop, sgd (e.g. adam:1e-3)",
    ),
    (
        "%train loss --data X,Y --optimizer adam:fast",
        "%train: --optimizer 'adam:fast': the learning rate 'fast' is not a number (e.g. adam:1e-3)",
    ),
    (
        "%train loss --data X,Y --optimizer sgd:-1",
        "%train: --optimizer 'sgd:-1': SGD: learning_rate must be positive, got -1.0",
    ),
    (  # an optimizer's settings: one the kind (here the default, adam) does not take, one out of its range
        "%train loss --data X,Y --nesterov",
        "%train: --nesterov: adam (cg.optim.Adam) has no such setting; it takes --beta1, --beta2, --epsilon, --amsgrad. --nesterov goes with --optimizer momentum",
    ),
    (
        "%train loss --data X,Y --optimizer sgd:0.1 --amsgrad --momentum 0.5",
        "%train: --amsgrad, --momentum: sgd (cg.optim.SGD) has no such setting; it takes none of these settings. --amsgrad goes with --optimizer adam, adamw; --momentum goes with --optimizer momentum, rmsprop",
    ),
    (
        "%train loss --data X,Y --optimizer momentum:0.1 --momentum 1.5 --nesterov",
        "%train: --momentum 1.5: Momentum: momentum must be in [0, 1), got 1.5",
    ),
    (
        "%train loss --data X,Y --optimizer adamw --weight-decay -0.1",
        "%train: --weight-decay -0.1: AdamW: weight_decay must be a finite number, 0 or more, got -0.1",
    ),
    ("%train loss --data X,Y --beta2 high", "%train: argument --beta2: expected a number, got 'high'"),
    (  # torch's and a misspelt flag's name: the ones meant
        "%train loss --data X,Y --betas 0.9,0.99",
        "%train: unrecognized arguments: --betas 0.9,0.99 (--betas: did you mean --beta1 or --beta2?)",
    ),
    (
        "%train loss --data X,Y --weight_decay=0.1 --stesp 3",
        "%train: unrecognized arguments: --weight_decay=0.1 --stesp 3 (--weight_decay: did you mean --weight-decay?; --stesp: did you mean --steps?)",
    ),
    (  # cg.train ignores it in sync mode (the default): a flag given for nothing
        "%train loss --data X,Y --max-staleness 2",
        "%train: --max-staleness bounds how stale an applied gradient may be in --mode async; a sync step drops every late gradient anyway: add --mode async, or leave --max-staleness out",
    ),
    (  # a space after a comma, as in Python: argparse read two words, and the LOSS given twice
        "%train loss --data X, Y",
        "%train: unrecognized arguments: Y ('X, Y': a list takes no spaces, write X,Y)",
    ),
    (
        "%train loss --data X,",
        "%train: --data 'X,' has an empty name: write the names without spaces, e.g. --data x_train,y_train",
    ),
    ("%train loss --data 'X,Y", '%train: cannot split the arguments "loss --data \'X,Y": No closing quotation'),
]


@pytest.mark.parametrize(("line", "words"), TRAIN_CASES, ids=[case[1][8:50] for case in TRAIN_CASES])
def test_train_refuses_bad_arguments(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str], shown: list[Any], line: str, words: str
) -> None:
    ok(shell, MODEL)
    before = user_values(shell)
    err = refused(shell, capsys, line)
    assert err.startswith(f"UsageError: {words}\n"), err
    assert TRAIN_USAGE in err and err.endswith("(see %train --help)\n")
    assert user_values(shell) == before and "job" not in shell.user_ns
    assert extension_of(shell).jobs == [] and shown == []


def test_train_and_placement_without_a_cluster_say_so_without_their_usage(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str], shown: list[Any]
) -> None:
    # The arguments are fine: the usage (9 lines for %train) buried the one line that says what to do.
    ok(shell, MODEL)
    for line in ("%train loss --data X,Y", "%placement"):
        err = refused(shell, capsys, line)
        assert err == (
            f"UsageError: {line.split()[0]}: no cluster is up: run %cluster up (or %cluster connect ADDRESS) first, or "
            "bind a cg.Cluster to `cluster`\n"
        )
    assert "job" not in shell.user_ns and shown == []


def test_train_usage_leaves_the_optimizer_settings_to_help(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    err = refused(shell, capsys, "%train loss --data X,Y --bogus 1")
    usage = err[err.index("usage:") :]
    assert "--nesterov" not in usage and "--resume-from DIR] [--no-show]" in usage and len(usage.splitlines()) <= 7
    ok(shell, "%train --help")
    assert "optimizer settings:" in capsys.readouterr().out


CLUSTER_USAGE = "usage: %cluster [-h] [--workers WORKERS] [--ps PS] [--gpus GPUS] [--threads THREADS]"
CLUSTER_CASES = [
    ("%cluster", "%cluster: the following arguments are required: {up,connect,status,scale,down}"),
    ("%cluster start", "%cluster: argument {up,connect,status,scale,down}: invalid choice: 'start'"),
    ("%cluster up --workers 0", "%cluster: argument --workers: expected a positive integer, got '0'"),
    ("%cluster up --ps -1", "%cluster: argument --ps: expected an integer of 0 or more, or colocated, got '-1'"),
    ("%cluster up --timeout inf", "%cluster: argument --timeout: expected a positive number, got 'inf'"),
    ("%cluster up --timeout nan", "%cluster: argument --timeout: expected a positive number, got 'nan'"),
    ("%cluster up --nodes 3", "%cluster: unrecognized arguments: --nodes 3"),
    ("%cluster up 3", "%cluster: up takes no '3'"),
    ("%cluster status --workers 2", "%cluster: --workers only go with %cluster up, not status"),
    ("%cluster down --ps 1 --gpus 1", "%cluster: --ps, --gpus only go with %cluster up, not down"),
    ("%cluster connect", "%cluster: connect needs the scheduler's ADDRESS, e.g. %cluster connect tcp://host:8786"),
    ("%cluster scale", "%cluster: scale needs N, a number of training workers of 1 or more, got None"),
    ("%cluster scale two", "%cluster: scale needs N, a number of training workers of 1 or more, got 'two'"),
    ("%cluster scale 0", "%cluster: scale needs N, a number of training workers of 1 or more, got '0'"),
]


@pytest.mark.parametrize(("line", "words"), CLUSTER_CASES, ids=[case[0] for case in CLUSTER_CASES])
def test_cluster_refuses_bad_arguments(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str], shown: list[Any], line: str, words: str
) -> None:
    err = refused(shell, capsys, line)
    assert err.startswith(f"UsageError: {words}"), err
    assert CLUSTER_USAGE in err and err.endswith("(see %cluster --help)\n")
    assert "cluster" not in shell.user_ns and extension_of(shell).cluster is None and shown == []


def test_cluster_scale_without_a_cluster_says_so_without_the_usage(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str], shown: list[Any]
) -> None:
    err = refused(shell, capsys, "%cluster scale 3")
    assert err == "UsageError: %cluster scale: no cluster is up to scale: %cluster up first\n"


def test_cluster_status_and_down_without_a_cluster_say_so(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str], shown: list[Any]
) -> None:
    capsys.readouterr()
    ok(shell, "%cluster status")
    assert capsys.readouterr().out == (
        "no cluster is up: %cluster up starts one on this machine, %cluster connect ADDRESS joins one\n"
    )
    ok(shell, "%cluster down")
    assert capsys.readouterr().out == "no cluster is up: nothing to close\n"
    assert shown == []


def free_port() -> int:
    """A port that was free a moment ago, and that nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_cluster_connect_to_a_refused_port_says_so_instead_of_waiting_out_the_timeout(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    # The default --timeout is 60 s: Dask alone would retry the refused port all that while, then say "timed out".
    err = refused(shell, capsys, f"%cluster connect tcp://127.0.0.1:{port}")
    assert err == (
        f"UsageError: %cluster connect: could not reach the Dask scheduler at tcp://127.0.0.1:{port}: "
        f"the connection was refused: nothing listens on port {port} of 127.0.0.1\n"
    )
    assert "cluster" not in shell.user_ns and extension_of(shell).cluster is None


def test_cluster_connect_to_an_unknown_host_says_the_host_is_unknown(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    err = refused(shell, capsys, "%cluster connect tcp://no-such-host.invalid:8786")
    assert err.startswith(
        "UsageError: %cluster connect: could not reach the Dask scheduler at tcp://no-such-host.invalid:8786: "
        "the host 'no-such-host.invalid' is unknown ("
    ), err
    assert err.endswith("): check the name\n") and "timed out" not in err.lower() and "tls" not in err
    assert "cluster" not in shell.user_ns and extension_of(shell).cluster is None


def test_cluster_connect_to_a_tls_address_without_certificates_says_what_to_configure(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    err = refused(shell, capsys, "%cluster connect tls://127.0.0.1:8786")
    assert err == (
        "UsageError: %cluster connect: tls://127.0.0.1:8786 is a TLS address, and Dask's configuration has no "
        "client certificates: set distributed.comm.tls.ca-file, distributed.comm.tls.client.cert and .key in "
        "Dask's configuration, or connect in Python: "
        "cluster = cg.Cluster.connect(ADDRESS, security=distributed.security.Security(...))\n"
    )


def test_the_reachability_look_has_a_deadline_and_leaves_what_it_cannot_judge_to_dask() -> None:
    outcome: list[str | None] = []
    # A hang guard only (the look itself takes milliseconds): a look that hangs fails here instead of stalling.
    look = threading.Thread(target=lambda: outcome.append(unreachable(f"tcp://127.0.0.1:{free_port()}")))
    look.start()
    look.join(HANG_GUARD_S)
    assert outcome and outcome[0] is not None and outcome[0].startswith("the connection was refused"), outcome
    with socket.socket() as listening:  # something listens: whether it is a scheduler is Dask's to find out
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        assert unreachable(f"tcp://127.0.0.1:{listening.getsockname()[1]}") is None
    assert unreachable("inproc://10.0.0.1/123/1") is None  # no host and port: nothing to look at
    assert unreachable("tcp://host-without-port") is None  # Cluster.connect says what is wrong with it


def test_cluster_help_says_what_the_timeout_waits_for(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    ok(shell, "%cluster --help")
    out = " ".join(capsys.readouterr().out.split())
    assert (
        "--timeout TIMEOUT up, scale: seconds to wait for the workers to start or leave; connect: seconds to wait "
        "for the scheduler to answer (a refused port or an unknown host fails at once); default 60"
    ) in out, out


@pytest.fixture
def connected_cluster() -> Iterator[Cluster]:
    """A real scheduler (in this process, no workers) joined with ``Cluster.connect``, as a remote one would be."""
    from distributed import LocalCluster

    with LocalCluster(n_workers=0, host="127.0.0.1", dashboard_address=None) as scheduler:
        cluster = Cluster.connect(scheduler.scheduler_address)
        try:
            yield cluster
        finally:
            cluster.close()


def test_scale_is_refused_for_a_connected_cluster_and_up_while_one_is_up(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str], shown: list[Any], connected_cluster: Cluster
) -> None:
    cluster = connected_cluster
    address = cluster.scheduler_address
    shell.user_ns["cluster"] = cluster  # bound by hand: the magics use it too
    err = refused(shell, capsys, "%cluster scale 4")
    assert err == (
        f"UsageError: %cluster scale: not supported for connected clusters (connected, {address}): "
        "scale it with whatever started it (dask-kubernetes, dask-jobqueue, the cloud console)\n"
    )
    err = refused(shell, capsys, "%cluster up")
    # The cell run again, most often: its view shown again, and one line (the arguments were fine).
    assert err == f"UsageError: %cluster up: a cluster is up already ({address}, shown above): %cluster down first\n"
    assert shell.user_ns["cluster"] is cluster and extension_of(shell).cluster is None
    assert [getattr(item, "cluster", item) for item in shown] == [cluster]


def write_checkpoint(root: Path, step: int) -> Path:
    """A real one-shard checkpoint of ``step`` under ``root``, as a parameter server writes it; its folder."""
    import numpy as np

    from cellgraph.cluster.ps.checkpoint import write_shard_checkpoint
    from cellgraph.cluster.ps.config import OptimizerConfig, TrainingConfig, VariableSpec

    w = np.zeros((4, 3), np.float32)
    info = write_shard_checkpoint(
        root, job_id="earlier", shard=0, num_shards=1, global_step=step, tensors={"w": w}, versions={"w": step},
        specs=[VariableSpec("w", w.dtype, w.shape)], optimizer=OptimizerConfig(), training=TrainingConfig(),
    )  # fmt: skip
    return info.path


def test_resume_from_names_a_complete_checkpoint_or_a_folder_of_them(tmp_path: Path) -> None:
    first, latest = write_checkpoint(tmp_path, 100), write_checkpoint(tmp_path, 300)
    assert resume_point(str(latest), 1) == (tmp_path, "ckpt-0000000300")
    assert resume_point(str(first), 1) == (tmp_path, "ckpt-0000000100")
    assert resume_point(str(tmp_path), 1) == (tmp_path, "ckpt-0000000300")  # a job's checkpoint_dir: its latest
    (tmp_path / "ckpt-0000000400").mkdir()  # a write that never finished: no manifest
    assert resume_point(str(tmp_path), 1) == (tmp_path, "ckpt-0000000300")


RESUME_CASES = [
    ("{missing}", "--resume-from '{missing}': there is no such folder"),
    (
        "{empty}",
        "--resume-from '{empty}' holds no complete checkpoint for 1 parameter server(s): give a job's "
        "checkpoint_dir, or one of its checkpoints' folders (job.checkpoints names them)",
    ),
    (
        "{root}/ckpt-0000000400",
        "--resume-from '{root}/ckpt-0000000400' is not a complete checkpoint for 1 parameter server(s) "
        "(complete ones in '{root}': ckpt-0000000300)",
    ),
    (
        "{root} --checkpoint-dir {empty}",
        "--resume-from '{root}' is a checkpoint of '{root}', and --checkpoint-dir says '{empty}': a resumed job "
        "checkpoints on into the folder it resumes from; leave --checkpoint-dir out",
    ),
]


@pytest.mark.parametrize(("given", "words"), RESUME_CASES, ids=["missing", "empty", "incomplete", "two-folders"])
def test_train_refuses_a_resume_point_it_cannot_use(
    shell: InteractiveShell,
    capsys: pytest.CaptureFixture[str],
    shown: list[Any],
    connected_cluster: Cluster,
    tmp_path: Path,
    given: str,
    words: str,
) -> None:
    root, empty = tmp_path / "run", tmp_path / "empty"
    write_checkpoint(root, 300)
    (root / "ckpt-0000000400").mkdir()
    empty.mkdir()
    where = {"missing": str(tmp_path / "missing"), "empty": str(empty), "root": str(root)}
    ok(shell, MODEL)
    shell.user_ns["cluster"] = connected_cluster
    err = refused(shell, capsys, f"%train loss --data X,Y --resume-from {given.format(**where)}")
    assert err.startswith(f"UsageError: %train: {words.format(**where)}\n"), err
    assert "job" not in shell.user_ns and extension_of(shell).jobs == [] and shown == []


def test_placement_refuses_what_it_cannot_place(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str], shown: list[Any]
) -> None:
    usage = "usage: %placement [-h] [--strategy {greedy,round_robin}] [GRAPH]\n(see %placement --help)\n"
    err = refused(shell, capsys, "%placement")
    assert err == f"UsageError: %placement: the default graph has no nodes yet: build it in a cell first\n{usage}"
    # The cells built into a named graph: 'build it in a cell first' read as if they had built nothing.
    ok(shell, "import cellgraph as cg")
    ok(shell, "%%graph enc --no-show\nz = cg.placeholder((None, 2), name='z')")
    err = refused(shell, capsys, "%placement")
    assert err == (
        "UsageError: %placement: the default graph has no nodes: your cells built into the named graph(s) enc; "
        f"name one, e.g. %placement enc\n{usage}"
    )
    ok(shell, MODEL)
    err = refused(shell, capsys, "%placement")
    assert err == (
        "UsageError: %placement: no cluster is up: run %cluster up (or %cluster connect ADDRESS) first, "
        "or bind a cg.Cluster to `cluster`\n"
    )
    err = refused(shell, capsys, "%placement encoder")
    assert err == (
        "UsageError: %placement: no graph named 'encoder'; named graphs: enc (a %%graph NAME cell makes one)\n" + usage
    )
    err = refused(shell, capsys, "%placement --strategy random")
    assert "%placement: argument --strategy: invalid choice: 'random' (choose from 'greedy', 'round_robin')" in err
    assert shown == []


def test_every_magic_has_help(shell: InteractiveShell, capsys: pytest.CaptureFixture[str]) -> None:
    for magic, words in [
        ("%train", "Launch cg.train(LOSS, ...) on the current cluster"),
        ("%cluster", "Start, join, show, scale or close the cluster"),
        ("%placement", "Place GRAPH on the current cluster's devices"),
    ]:
        capsys.readouterr()
        ok(shell, f"{magic} --help")
        out = capsys.readouterr().out
        assert out.startswith(f"usage: {magic} [-h]") and words in out and "options:" in out, out
        # IPython's own help (%train?) is the same text, not its reST code block with <metavars>.
        doc = shell.find_line_magic(magic[1:]).__doc__
        assert doc.startswith(f"usage: {magic} [-h]") and "::" not in doc and "<" not in doc, doc


@pytest.mark.parametrize(
    ("spec", "kind", "rate"),
    [("adam:1e-2", cg.optim.Adam, 1e-2), ("Adam", cg.optim.Adam, 1e-3), ("sgd:0.5", cg.optim.SGD, 0.5),
     ("momentum", cg.optim.Momentum, 1e-2), ("rmsprop:0.01", cg.optim.RMSProp, 0.01),
     ("adagrad", cg.optim.Adagrad, 1e-2), ("AdamW:3e-4", cg.optim.AdamW, 3e-4)],
)  # fmt: skip
def test_optimizer_specs(spec: str, kind: type, rate: float) -> None:
    opt = optimizer(spec)
    assert (type(opt), opt.learning_rate) == (kind, rate)


def test_optimizer_settings_are_cg_optims_keywords() -> None:
    opt = optimizer("momentum:0.1", {"momentum": 0.5, "nesterov": True, "amsgrad": None})  # None: not given
    assert repr(opt) == repr(cg.optim.Momentum(0.1, momentum=0.5, nesterov=True))
    opt = optimizer("adamw", {"beta1": 0.8, "beta2": 0.99, "weight_decay": 0.1, "amsgrad": True})
    assert repr(opt) == repr(cg.optim.AdamW(1e-3, beta1=0.8, beta2=0.99, weight_decay=0.1, amsgrad=True))


def test_a_misspelt_magic_is_told_the_one_it_may_mean(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    # IPython said only "Line magic function `%trian` not found." (the new-user walkthrough's first typo).
    said = refused(shell, capsys, "%trian loss --data X,Y")
    assert said == "UsageError: Line magic function `%trian` not found. Did you mean %train?\n"
    said = refused(shell, capsys, "%%grpah mlp\nx = 1\n")
    assert said == "UsageError: Cell magic `%%grpah` not found. Did you mean %%graph?\n"
    assert refused(shell, capsys, "%zzqqx") == "UsageError: Line magic function `%zzqqx` not found.\n"  # nothing near
