"""Which parameter server holds which variable, or which rows of it.

In a cluster the placement computed by the devices issue decides
(``cg.placement.place``: variables greedy by bytes onto ``ps`` tasks, large
ones split along axis 0). Standalone, with no graph, the same greedy rule and
the same split threshold are applied to the variables themselves, so both
paths spread the bytes the same way.

Examples
--------
>>> import numpy as np
>>> layout = shard_variables({"w": np.zeros((8, 4), np.float32), "b": np.zeros(4, np.float32)}, num_shards=2)
>>> [(shard, spec.rows) for shard, spec in layout["w"]]
[(0, (0, 4)), (1, (4, 8))]
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import replace

import numpy as np

from cellgraph.dataflow.devices import DeviceSpec
from cellgraph.dataflow.placement import Placement, PsItem, greedy_by_bytes, row_ranges

from ..errors import ParameterServerError
from .config import TrainingConfig, VariableSpec

# variable name -> its pieces, each (shard index, the piece's spec), in row order.
Layout = dict[str, list[tuple[int, VariableSpec]]]


def piece(name: str, value_shape: tuple[int, ...], dtype: np.dtype, rows: tuple[int, int] | None) -> VariableSpec:
    """The spec of rows ``[start, stop)`` of a variable (the whole of it when ``rows`` is None)."""
    if rows is None:
        return VariableSpec(name, dtype, value_shape, value_shape, (0, value_shape[0] if value_shape else 0))
    shape = (rows[1] - rows[0], *value_shape[1:])
    return VariableSpec(name, dtype, shape, value_shape, rows)


def shard_variables(
    variables: Mapping[str, np.ndarray],
    num_shards: int,
    split_threshold: int | None = None,
) -> Layout:
    """Spread ``variables`` over ``num_shards`` servers: largest first onto the least-loaded.

    A variable over ``split_threshold`` bytes (default: an even share of the
    total) with more than one row is cut along axis 0 across shards, as the
    placement does for a graph's variables.
    """
    if num_shards < 1:
        raise ParameterServerError(f"num_shards must be at least 1, got {num_shards}", "INVALID_ARGUMENT")
    sizes = {name: int(np.asarray(value).nbytes) for name, value in variables.items()}
    if split_threshold is None:
        split_threshold = max(1, sum(sizes.values()) // num_shards)
    shards = [str(i) for i in range(num_shards)]
    items: list[PsItem] = []
    cuts: dict[str, list[tuple[int, int]]] = {}
    for order, (name, value) in enumerate(variables.items()):
        shape, nbytes = np.shape(value), sizes[name]
        rows = shape[0] if shape else 0
        if nbytes > split_threshold and num_shards > 1 and rows > 1:
            count = min(num_shards, rows, max(2, math.ceil(nbytes / split_threshold)))
            cuts[name] = row_ranges(rows, count)
            items += [PsItem(name, part, nbytes * (b - a) // rows, order) for part, (a, b) in enumerate(cuts[name])]
        else:
            items.append(PsItem(name, 0, nbytes, order))
    chosen = greedy_by_bytes(items, shards, dict.fromkeys(shards, 0))
    layout: Layout = {name: [] for name in variables}
    for item, shard in zip(items, chosen):
        value = np.asarray(variables[item.variable])
        rows = cuts[item.variable][item.part] if item.variable in cuts else None
        layout[item.variable].append((int(shard), piece(item.variable, value.shape, value.dtype, rows)))
    return layout


def layout_from_placement(placement: Placement, variables: Mapping[str, np.ndarray]) -> Layout:
    """The layout a graph's placement chose: ``ps`` task ``i`` is shard ``i``."""
    layout: Layout = {}
    for name, value in variables.items():
        value = np.asarray(value)
        if name not in placement.device_of:
            raise ParameterServerError(
                f"variable '{name}' is not in the placement; it places: {', '.join(sorted(placement.variable_bytes))}",
                "NOT_FOUND",
            )
        parts = placement.partitions.get(name) or [(placement.device_of[name], -1, -1)]
        layout[name] = []
        for device, start, stop in parts:
            spec = DeviceSpec.parse(device)
            if spec.job != "ps" or spec.task is None:
                raise ParameterServerError(
                    f"variable '{name}' is placed on {device}, not on a ps task; parameter servers hold only "
                    "variables placed on /job:ps/task:<i>",
                    "FAILED_PRECONDITION",
                )
            rows = None if start < 0 else (start, stop)
            layout[name].append((spec.task, piece(name, value.shape, value.dtype, rows)))
    return layout


def num_shards_of(layout: Layout) -> int:
    return 1 + max((shard for pieces in layout.values() for shard, _ in pieces), default=0)


def job_layout(
    job_id: str,
    arrays: Mapping[str, np.ndarray],
    shards: int,
    training: TrainingConfig,
    placement: Placement | None = None,
    split_threshold: int | None = None,
    moving: Mapping[str, float] | Collection[str] = (),
) -> Layout:
    """The layout a job's Init gives ``shards`` servers: ``placement``'s when given, else ``shard_variables``'s;
    the variables named in ``moving`` marked as moving statistics (with their momenta, when a mapping). Refused
    with INVALID_ARGUMENT when a moving statistic is no variable, when ``training`` does not fit the shards
    used, or when the layout uses a shard beyond ``shards``.

    >>> import numpy as np
    >>> from cellgraph.cluster.ps.config import TrainingConfig
    >>> arrays = {"w": np.zeros(4, np.float32), "mean": np.zeros(2, np.float32)}
    >>> layout = job_layout("j", arrays, 1, TrainingConfig(), moving={"mean": 0.9})
    >>> {name: [(shard, spec.moving, spec.momentum) for shard, spec in pieces] for name, pieces in layout.items()}
    {'w': [(0, False, 0.0)], 'mean': [(0, True, 0.9)]}
    >>> job_layout("j", arrays, 1, TrainingConfig(), moving=["var"])
    Traceback (most recent call last):
    ...
    cellgraph.cluster.errors.ParameterServerError: moving statistic(s) 'var' are not among the job's variables
    """
    if placement is not None:
        layout = layout_from_placement(placement, arrays)
    else:
        layout = shard_variables(arrays, shards, split_threshold)
    unknown = sorted(set(moving) - set(arrays))
    if unknown:
        raise ParameterServerError(
            f"moving statistic(s) {', '.join(map(repr, unknown))} are not among the job's variables",
            "INVALID_ARGUMENT",
        )
    momenta = dict(moving) if isinstance(moving, Mapping) else dict.fromkeys(moving, 0.0)
    layout = {
        name: [(s, replace(spec, moving=name in momenta, momentum=momenta.get(name, 0.0))) for s, spec in pieces]
        for name, pieces in layout.items()
    }
    used = {shard for pieces in layout.values() for shard, _ in pieces}
    problem = training.layout_problem(len(used))
    if problem:
        raise ParameterServerError(f"Init of job '{job_id}': {problem}", "INVALID_ARGUMENT")
    if max(used, default=0) >= shards:
        raise ParameterServerError(
            f"the layout uses shard {max(used)}, but this client knows {shards} server(s)", "INVALID_ARGUMENT"
        )
    return layout
