"""Rows for PlaceholderWithDefault: the default passed on (a feed replaces it: tests/test_layers_training.py)."""

from __future__ import annotations

import cellgraph as cg

from . import OpCase, rand

CASES = [
    OpCase("PlaceholderWithDefault", lambda x: cg.placeholder_with_default(x), [rand(2, 3)]),
    OpCase(
        "PlaceholderWithDefault",
        lambda x: cg.placeholder_with_default(x, (None, x.shape[1])),
        [rand(4, 3)],
        static_shapes=[(None, 3)],
        id="relaxed-batch",
    ),
]
