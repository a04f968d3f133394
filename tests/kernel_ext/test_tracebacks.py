"""A cellgraph error in a notebook shows the cell's lines and the error, not 40 frames of cellgraph's code."""

from __future__ import annotations

import pytest
from IPython.core.interactiveshell import InteractiveShell

from cellgraph.kernel_ext import tracebacks

from .shells import ok, run

CELLS = [
    "import cellgraph as cg\nx = cg.placeholder((None, 3), name='x')",
    "w = cg.variable(cg.init.zeros, shape=(4, 2), name='w')\ndef layer(t):\n    return cg.matmul(t, w)\ny = layer(x)",
]


def _error_output(shell: InteractiveShell, capsys: pytest.CaptureFixture[str]) -> str:
    for cell in CELLS[:-1]:
        ok(shell, cell)
    capsys.readouterr()
    result = run(shell, CELLS[-1])
    assert result.error_in_exec is not None and type(result.error_in_exec).__name__ == "ShapeError"
    captured = capsys.readouterr()
    return captured.out + captured.err


def test_a_cellgraph_error_shows_the_cells_frames_and_the_error_only(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    text = _error_output(shell, capsys)
    assert "ShapeError: MatMul 'matmul' (cell [" in text and "inner dimensions differ: (None, 3) @ (4, 2)" in text
    assert "----> 4 y = layer(x)" in text and "----> 3     return cg.matmul(t, w)" in text  # the user's lines
    assert "dataflow" not in text and "ops/base.py" not in text and "graph.py" not in text, text


def test_xmode_verbose_shows_cellgraphs_frames_and_unloading_puts_ipythons_handler_back(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    assert shell.custom_exceptions == tracebacks.ERRORS
    ok(shell, "%xmode Verbose")
    text = _error_output(shell, capsys)
    assert "dataflow" in text and "ShapeError: MatMul 'matmul'" in text
    ok(shell, "%xmode Context")
    ok(shell, "%unload_ext cellgraph")
    assert shell.custom_exceptions == ()
    ok(shell, "%load_ext cellgraph")
    assert shell.custom_exceptions == tracebacks.ERRORS


@pytest.mark.parametrize(
    ("cell", "error", "inside"),
    [
        ("cg.optim.Nadam(-1e-3)", "ValueError: Nadam: learning_rate must be positive, got -0.001", "optimizers.py"),
        (
            "with cg.layers.policy('mixed_float32'):\n    pass",
            "ValueError: unknown dtype policy 'mixed_float32'; known: float32, mixed_bfloat16, mixed_float16",
            "precision.py",
        ),
        (
            "cg.optim.mixed_precision(cg.optim.SGD(0.1), initial_scale=0)",
            "ValueError: mixed_precision: initial_scale must be a finite number more than 0, got 0",
            "mixed_precision.py",
        ),
    ],
)
def test_an_argument_cellgraph_refuses_shows_the_cells_line_and_the_error_only(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str], cell: str, error: str, inside: str
) -> None:
    """A plain ValueError of cellgraph's own argument checks came with its frames (contextlib's, precision.py's)."""
    ok(shell, "import cellgraph as cg")
    capsys.readouterr()
    result = run(shell, cell)
    assert type(result.error_in_exec).__name__ == "ValueError"
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert error in text and f"----> 1 {cell.splitlines()[0]}" in text, text
    assert inside not in text and "contextlib" not in text and "dataflow" not in text, text


def test_a_type_error_inside_cellgraph_that_it_did_not_raise_keeps_its_frames(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    ok(shell, "import cellgraph as cg")
    capsys.readouterr()
    result = run(shell, "cg.optim.clip_by_global_norm(None, 1.0)")
    assert type(result.error_in_exec).__name__ == "TypeError"
    captured = capsys.readouterr()
    assert "optimizers.py" in captured.out + captured.err  # no raise of cellgraph's: shown whole, to report


def test_an_error_that_is_not_cellgraphs_keeps_its_whole_traceback(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    result = run(shell, "import json\njson.loads('{')")
    assert type(result.error_in_exec).__name__ == "JSONDecodeError"
    captured = capsys.readouterr()
    assert "decoder.py" in captured.out + captured.err  # the library's own frames, as IPython shows them


def test_other_warnings_keep_their_format_and_unloading_puts_the_previous_one_back(shell: InteractiveShell) -> None:
    import warnings

    fmt = warnings.formatwarning
    assert isinstance(fmt, tracebacks.WarningFormat)
    assert fmt("careful", UserWarning, "/x.py", 3).startswith("/x.py:3: UserWarning: careful")
    ok(shell, "%unload_ext cellgraph")
    assert warnings.formatwarning is fmt.previous
    ok(shell, "%load_ext cellgraph")


def test_a_graph_cells_error_shows_its_lines_not_ipythons_rewrite_of_the_cell(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    ok(shell, "import cellgraph as cg")
    capsys.readouterr()
    result = run(shell, "%%graph\nx = cg.placeholder((None, 3), name='x')\ny = cg.matmul(x, cg.placeholder((4, 2)))")
    assert type(result.error_in_exec).__name__ == "ShapeError"
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert "run_cell_magic" not in text and "magics_graph" not in text, text
    assert "----> 3 y = cg.matmul(x, cg.placeholder((4, 2)))" in text, text


def test_a_kernels_error_in_a_run_is_told_once_without_cellgraphs_frames(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    ok(shell, "import numpy as np\nimport cellgraph as cg")
    ok(
        shell,
        "logits = cg.placeholder((None, 3), name='logits')\nlabels = cg.placeholder((None,), 'int32', name='labels')",
    )
    ok(shell, "xent = cg.losses.sparse_softmax_cross_entropy(logits, labels)\nsess = cg.Session()")
    capsys.readouterr()
    result = run(shell, "sess.run(xent, {logits: np.zeros((2, 3), np.float32), labels: np.array([0, 7], np.int32)})")
    error = result.error_in_exec
    assert type(error).__name__ == "ExecutionError" and isinstance(error.__cause__, ValueError)  # kept for %debug
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert "failed while running: ValueError: label 7 of example 1 is outside the valid range [0, 3)" in text
    assert "----> 1 sess.run(xent" in text
    assert "direct cause" not in text and "executor.py" not in text and "nn.py" not in text, text
    assert "<cellgraph plan" not in text and text.count("label 7") == 1, text
