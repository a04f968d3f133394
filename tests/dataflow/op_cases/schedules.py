"""LearningRateSchedule: each kind of schedule, at a step inside each of its phases."""

from __future__ import annotations

import numpy as np

import cellgraph as cg
from cellgraph.dataflow.ops.schedule import learning_rate_schedule

from . import OpCase

SCHEDULES = {
    "piecewise": cg.optim.piecewise_constant([10, 20], [1.0, 0.5, 0.25]),
    "exponential": cg.optim.exponential_decay(0.1, decay_steps=4, decay_rate=0.5),
    "exponential-staircase": cg.optim.exponential_decay(0.1, decay_steps=4, decay_rate=0.5, staircase=True),
    "cosine-warmup": cg.optim.cosine_decay(0.1, decay_steps=20, warmup_steps=10, alpha=0.1),
}
STEPS = {"warmup": np.array(5, np.int32), "middle": np.array(15, np.int64), "end": np.array(40, np.int32)}

CASES = [
    OpCase(
        "LearningRateSchedule",
        lambda step, _s=schedule: learning_rate_schedule(_s, step, "float64"),
        [step],
        grad=False,
        id=f"{label}-{when}",
    )
    for label, schedule in SCHEDULES.items()
    for when, step in STEPS.items()
] + [
    OpCase(
        "LearningRateSchedule",
        lambda step: learning_rate_schedule(SCHEDULES["cosine-warmup"], step, "float32"),
        [np.array(12, np.int32)],
        grad=False,
        id="float32",
    )
]
