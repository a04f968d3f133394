"""The conformance table: widened passes are shown apart, unsupported cases count against the rate."""

from __future__ import annotations

from cellgraph.onnx import conformance


def test_a_row_gives_the_rate_with_and_without_widened_passes_and_counts_unsupported_against() -> None:
    result = conformance.OpResult(
        "Equal",
        passed=["test_equal", "test_equal_int8"],
        widened=["test_equal_int8"],
        unsupported={"test_equal_string": "dtype STRING of value 'x' has no cellgraph equivalent (Equal node 'e')"},
    )
    assert result.total == 3 and f"{result.pass_rate:.0%}" == "67%"
    table = conformance.markdown_table({"Equal": result}).splitlines()
    assert table[0].count("|") == table[1].count("|") == 9
    assert table[2] == "| Equal | 3 | 2 (1) | 0 | 1 (1) | 67% | 33% | dtype STRING of value 'x' |"
    # The overall rate: unsupported cases are in the denominator, never among the passes.
    assert conformance.pass_rate({"Equal": result}) == 2 / 3
    assert conformance.pass_rate({"Equal": result}, widened=False) == 1 / 3
