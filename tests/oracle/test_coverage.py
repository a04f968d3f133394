"""The oracle table covers every differentiable op (runs without PyTorch too)."""

from __future__ import annotations

import numpy as np

from cellgraph.dataflow.opdef import OPS, not_differentiable

from .rows import NO_ORACLE_ROW, ROWS, build, concrete


def _differentiable() -> set[str]:
    return {op for op in OPS if OPS.lookup(op).grad is not not_differentiable}


def test_every_differentiable_op_has_an_oracle_row() -> None:
    covered = {row.op for row in ROWS}
    missing = sorted(_differentiable() - covered - set(NO_ORACLE_ROW))
    assert not missing, (
        f"differentiable ops with no row in tests/oracle/rows.py and no reason in NO_ORACLE_ROW: {missing}"
    )


def test_recorded_reasons_are_current() -> None:
    covered = {row.op for row in ROWS}
    for op, reason in NO_ORACLE_ROW.items():
        assert op in OPS, f"NO_ORACLE_ROW names {op!r}, which is not a registered op"
        assert op in _differentiable(), f"NO_ORACLE_ROW names {op!r}, which is not differentiable: drop it"
        assert op not in covered, f"{op!r} has a row now: drop its NO_ORACLE_ROW entry"
        assert reason.strip(), f"NO_ORACLE_ROW[{op!r}] gives no reason"


def test_rows_build_the_op_they_name_and_have_unique_labels() -> None:
    labels = [row.label for row in ROWS]
    assert len(labels) == len(set(labels)), sorted({lb for lb in labels if labels.count(lb) > 1})
    rng = np.random.default_rng(0)
    for row in ROWS:
        sizes = row.size_sets()[0][1]
        build(row, [spec.make(rng, concrete(spec.shape, sizes)) for spec in row.inputs], sizes, dynamic=True)
