"""The example models, trained a few steps in one session, shared by the export tests."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

import cellgraph as cg
from cellgraph.examples import digits, models


@dataclass
class Trained:
    """A model after a few Adam steps: its session, and its test images in the model's layout."""

    model: models.Model
    session: cg.Session
    x_test: np.ndarray

    def logits(self, x: np.ndarray) -> np.ndarray:
        """The session's logits in inference mode (a model's training switch fed False)."""
        feeds = {self.model.x: x}
        if self.model.training is not None:
            feeds[self.model.training] = False
        return np.asarray(self.session.run(self.model.logits, feeds))


def train(name: str, data: digits.Split, steps: int = 5) -> Trained:
    model = models.MODELS[name]()
    session = cg.Session(model.graph)
    x_train = data.images(data.x_train) if model.image_input else data.x_train
    for i in range(steps):
        rows = slice(i * 64, (i + 1) * 64)
        session.run(model.train_op, {model.x: x_train[rows], model.y: data.y_train[rows]})
    x_test = data.images(data.x_test) if model.image_input else data.x_test
    return Trained(model, session, x_test)


# Every example model: the batch-normalized ones (resnet, inception_v3) export with their
# training switch fixed off, the sequence ones (transformer, lstm) with batched matmuls.
MODEL_NAMES = ["mlp", "inception", "resnet", "inception_v3", "transformer", "lstm"]


@pytest.fixture(scope="session", params=MODEL_NAMES)
def trained(request: pytest.FixtureRequest, data: digits.Split) -> Trained:
    return train(request.param, data)
