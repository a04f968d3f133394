"""State ops on a device: constants and variables live as device arrays."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from numba import cuda

from . import device_value


def const_op(node: Any, ctx: Any) -> Callable[[], Any]:
    # Copied once, when the plan is built; every run hands out the same array.
    value = cuda.to_device(node.attrs["value"])
    return lambda: value


def variable_op(node: Any, ctx: Any) -> Callable[[], Any]:
    value = device_value(ctx.variables, node)
    return lambda: value


def assign_op(node: Any, ctx: Any) -> Callable[[Any, Any], Any]:
    def run(ref: Any, value: Any) -> Any:
        ref.copy_to_device(value)  # device to device
        return ref

    return run
