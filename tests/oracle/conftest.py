from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """PyTorch on one thread while an oracle test runs (the machine has two cores, shared)."""
    try:
        import torch
    except ImportError:  # the comparisons skip; the coverage test needs no torch
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
