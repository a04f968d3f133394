"""scikit-learn's bundled 8x8 digits (1,797 images, shipped inside the package: no download)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

INSTALL_HINT = "cellgraph demo needs scikit-learn for its data set: pip install 'cellgraph[examples]'"


@dataclass(frozen=True)
class Split:
    """Images as (N, 64) float32 in [0, 1], labels as (N,) int32."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray

    def images(self, x: np.ndarray) -> np.ndarray:
        """The NHWC view a convolutional model takes: (N, 8, 8, 1)."""
        return x.reshape(-1, 8, 8, 1)


def load(test_fraction: float = 0.2, seed: int = 0) -> Split:
    """The fixed train/test split: shuffled with ``seed``, the last ``test_fraction`` held out."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as err:
        raise ImportError(INSTALL_HINT) from err
    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    y = data.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(x))
    cut = int(round(len(x) * (1 - test_fraction)))
    train, test = order[:cut], order[cut:]
    return Split(x[train], y[train], x[test], y[test])
