"""The README's examples run, and its quick start is exactly two command lines."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def test_quick_start_is_two_command_lines() -> None:
    quick = README.split("## Quick start", 1)[1]
    block = re.search(r"```bash\n(.*?)```", quick, flags=re.S)
    assert block is not None
    lines = [line for line in block.group(1).splitlines() if line.strip()]
    assert lines == [
        "pip install -e '.[examples]' && cellgraph demo",
        "pip install -e '.[test]' && pytest -n 2 --dist loadfile",
    ]


@pytest.mark.parametrize("source", _blocks("python"), ids=lambda s: s.splitlines()[2][:40])
def test_readme_python_block_runs(source: str, capsys: pytest.CaptureFixture[str]) -> None:
    exec(compile(source, "example.py", "exec"), {})  # noqa: S102 - our own README
    out = capsys.readouterr().out
    for expected in re.findall(r"# (\w+ '.*)$", source, flags=re.M):
        assert expected in out
