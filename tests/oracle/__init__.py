"""The standing oracle (issue 13): cellgraph against PyTorch's CPU autograd, in float64.

``rows.py`` holds one table row per differentiable op, each with a PyTorch
expression of the same math written from the op's documented semantics;
``test_ops.py`` runs every row with static shapes and with ``None`` dims fed
as 1 and as n (and 0 where a row says so), fused and unfused;
``test_dags.py`` does the same for random graphs of 5 to 15 ops;
``test_optimizers.py`` trains a small MLP with every optimizer;
``test_models_training.py`` trains whole models (an LSTM classifier, a transformer block, a CNN with batch
norm) step by step against torch's modules.

PyTorch is never a dependency: CI installs its pinned CPU build, and where it
is missing the comparisons skip with :data:`NO_TORCH` as the reason (the
coverage test, ``test_coverage.py``, runs anyway).
"""

from __future__ import annotations

NO_TORCH = (
    "PyTorch is not installed: the oracle suite compares against torch's CPU autograd (pip install torch==2.13.0)"
)
