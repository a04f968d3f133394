"""``LearningRateSchedule`` on a device: the schedule is Python (``dataflow/schedules.py``), so the step's
one value is read back, and the rate, one scalar, is copied to the device for the update kernels to read."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from numba import cuda

from ...schedules import schedule_from_fields


def learning_rate_op(node: Any, ctx: Any) -> Callable[[Any], Any]:
    schedule, dtype = schedule_from_fields(node.attrs["schedule"], node.attrs), node.attrs["dtype"]
    # Two scalar copies per step, the size of the flag gather's index check reads back; float64, then cast
    # once, as the CPU kernel and a parameter server compute it.
    return lambda step: cuda.to_device(np.asarray(schedule.value(int(step.copy_to_host())), dtype=dtype))
