"""``%load_ext cellgraph``: what loading registers, that loading twice is harmless, and what unloading leaves."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

import cellgraph as cg
from cellgraph.kernel_ext import load_ipython_extension, named_graphs, unload_ipython_extension

from .shells import names, ok, run

LINE_MAGICS = {"graph", "cluster", "placement", "train"}
TIMEOUT_S = 120.0  # for a fresh Python process to import cellgraph on a busy machine


def ours(shell: InteractiveShell, event: str) -> int:
    """How many of the event's callbacks are the extension's."""
    return sum(getattr(cb, "__module__", "") == "cellgraph.kernel_ext.cells" for cb in shell.events.callbacks[event])


def test_loading_registers_the_magics_and_the_hooks_once(shell: InteractiveShell) -> None:
    magics = shell.magics_manager.magics
    assert LINE_MAGICS <= set(magics["line"]) and "graph" in magics["cell"]
    assert ours(shell, "pre_run_cell") == ours(shell, "post_run_cell") == 1
    load_ipython_extension(shell)  # twice, directly
    ok(shell, "%load_ext cellgraph")  # and through IPython, which says it is loaded already
    assert ours(shell, "pre_run_cell") == ours(shell, "post_run_cell") == 1
    ok(shell, "import cellgraph as cg")
    for _ in range(2):
        ok(shell, "x = cg.placeholder((2,), name='x')", "a")
    assert names(cg.get_default_graph()) == ["x"]


def test_the_package_itself_is_the_extension(shell: InteractiveShell) -> None:
    assert cg.load_ipython_extension is not None and cg.unload_ipython_extension is not None
    ok(shell, "%unload_ext cellgraph")
    assert "train" not in shell.magics_manager.magics["line"]
    cg.load_ipython_extension(shell)
    assert "train" in shell.magics_manager.magics["line"]


def test_unloading_removes_magics_and_hooks_and_keeps_graphs(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    ok(shell, "import cellgraph as cg")
    ok(shell, "%%graph enc --no-show\nz = cg.placeholder((2,), name='z')", "a")
    encoder = named_graphs(shell)["enc"]
    # Unloading from inside a cell: the cell's scope is closed there and then, not left open.
    ok(shell, "%unload_ext cellgraph", "b")
    assert ours(shell, "pre_run_cell") == ours(shell, "post_run_cell") == 0
    magics = shell.magics_manager.magics
    assert not LINE_MAGICS & set(magics["line"]) and "graph" not in magics["cell"]
    assert "GraphMagics" not in shell.magics_manager.registry
    result = run(shell, "%train loss")
    assert isinstance(result.error_in_exec, UsageError) and "not found" in str(result.error_in_exec)
    # Cells are not tracked any more: a hand-made cell scope does not meet one left open.
    ok(shell, "with cg.cell_scope('mine'):\n    y = cg.placeholder((2,), name='y')", "c")
    unload_ipython_extension(shell)  # twice: harmless
    ok(shell, "%load_ext cellgraph")
    assert named_graphs(shell)["enc"] is encoder and names(encoder) == ["z"]
    ok(shell, "%%graph enc --no-show\nz = cg.placeholder((3,), name='z')", "a")
    assert names(encoder) == ["z"] and encoder.node("z").specs[0].shape == (3,)


def test_named_graphs_needs_a_running_shell_outside_one() -> None:
    # In a fresh process: in this one, another test may have left an IPython shell instance behind.
    script = (
        "from cellgraph.kernel_ext import named_graphs\n"
        "try:\n"
        "    named_graphs()\n"
        "except RuntimeError as err:\n"
        "    print(err)\n"
    )
    ran = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=TIMEOUT_S)
    assert ran.returncode == 0, ran.stderr
    assert re.match(r"named_graphs\(\) needs a running IPython", ran.stdout), ran.stdout


def _completions(shell: InteractiveShell, line: str) -> list[str]:
    """What the kernel answers a complete_request with for ``line``, the cursor at its end."""
    from IPython.core.completer import provisionalcompleter

    with provisionalcompleter():
        return [c.text for c in shell.Completer.completions(line, len(line))]


@pytest.mark.parametrize(
    ("line", "want", "not_offered"),
    [
        ("%train xent --rep", ["--replicas", "--replicas-to-aggregate"], "repr"),
        ("%train xent --mode ", ["async", "sync"], None),
        ("%cluster u", ["up"], "%unalias"),
        ("%cluster up --w", ["--workers"], None),
        ("%export out --inputs x --for", ["--format"], None),
        ("%%graph --n", ["--no-show"], None),
        ("%placement --strategy r", ["round_robin"], None),
        ("%train my_loss_t", ["my_loss_tensor"], None),
        ("%train my_loss_tensor --data my_x,my_", ["my_x", "my_y"], None),
        ("%train xent --nest", ["--nesterov"], None),  # an optimizer's settings, from the registry
        ("%train xent --optimizer momentum:0.1 --", ["--momentum", "--nesterov"], "--amsgrad"),
        ("%train xent --optimizer adamw --", ["--amsgrad", "--beta1", "--weight-decay"], "--nesterov"),
    ],
)  # fmt: skip
def test_tab_completes_the_magics_options_and_choices(
    shell: InteractiveShell, line: str, want: list[str], not_offered: str | None
) -> None:
    """%train xent --rep<Tab> offered `repr`, %cluster u<Tab> %unalias and %unload_ext, %train my_<Tab> nothing."""
    ok(shell, "my_loss_tensor, my_x, my_y = 1, 2, 3")
    got = _completions(shell, line)
    assert [g for g in got if g in want] == want, got
    assert not_offered not in got, got


def test_tab_completes_an_optimizer_and_its_rate(shell: InteractiveShell) -> None:
    """%train loss --optimizer <Tab> offered Python's keywords and every magic (and, %%!, ...); na<Tab> nothing."""
    assert _completions(shell, "%train loss --optimizer ") == [
        "adadelta:1", "adagrad:0.01", "adam:0.001", "adamax:0.002", "adamw:0.001", "momentum:0.01", "nadam:0.002",
        "rmsprop:0.001", "sgd:0.01",
    ]  # fmt: skip
    assert _completions(shell, "%train loss --optimizer na") == ["nadam:0.002"]
    assert _completions(shell, "%train loss --optimizer nadam:") == ["0.002"]  # after the colon: its default rate


def test_unloading_takes_the_completion_away(shell: InteractiveShell) -> None:
    ok(shell, "%unload_ext cellgraph")
    assert "--replicas" not in _completions(shell, "%train xent --rep")
    ok(shell, "%load_ext cellgraph")
    assert "--replicas" in _completions(shell, "%train xent --rep")
