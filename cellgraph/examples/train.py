"""A single-process training loop over a built ``Model``, with a progress bar."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

import cellgraph as cg

from .digits import Split
from .models import Model
from .progress import progress_bar


@dataclass(frozen=True)
class Result:
    model: str
    epochs: int
    steps: int
    first_step_seconds: float  # JIT compilation (or cache load) + plan building + one step
    train_seconds: float
    samples_per_second: float
    test_accuracy: float


def fit(model: Model, data: Split, epochs: int, batch_size: int = 64, seed: int = 0, progress: bool = True) -> Result:
    """Train ``model`` on ``data`` for ``epochs`` shuffled epochs; evaluate on the test split."""
    sess = cg.Session(model.graph)
    x_train = data.images(data.x_train) if model.image_input else data.x_train
    x_test = data.images(data.x_test) if model.image_input else data.x_test
    step = sess.make_callable([model.train_op, model.loss], [model.x, model.y])
    rng = np.random.default_rng(seed)

    start = time.perf_counter()
    step(x_train[:batch_size], data.y_train[:batch_size])
    first_step = time.perf_counter() - start

    batches = range(0, len(x_train) - batch_size + 1, batch_size)
    bar = _progress(epochs * len(batches), model.name, progress)
    samples, loss = 0, float("nan")
    start = time.perf_counter()
    for _ in range(epochs):
        order = rng.permutation(len(x_train))
        for i in batches:
            idx = order[i : i + batch_size]
            (loss,) = step(x_train[idx], data.y_train[idx])
            samples += batch_size
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.set_postfix(loss=f"{float(loss):.4f}")
    elapsed = time.perf_counter() - start
    if bar is not None:
        bar.close()
    accuracy = float(sess.run(model.accuracy, model.eval_feeds(x_test, data.y_test)))
    return Result(model.name, epochs, epochs * len(batches), first_step, elapsed, samples / elapsed, accuracy)


def _progress(total: int, label: str, enabled: bool) -> Any:
    if not enabled:
        return None
    return progress_bar(total, f"training {label}")
