"""Placement: which device each node runs on, and why, without changing the graph.

The rules, in the order they are tried for each node:

1. an explicit ``with cg.device(...)`` scope wins (a partial name is completed
   from the available devices);
2. variables go to ``ps`` tasks, the largest first onto the least-loaded task
   (TensorFlow's round-robin overloads one task, tensorflow#24953); a variable
   larger than the split threshold is split along axis 0 across tasks; an
   optimizer slot follows its variable;
3. a stateful op that updates a variable in place (``Assign``, ``ApplyAdam``:
   the variable is input 0) runs where the variable lives;
4. a node made inside ``colocate_with`` (gradient ops are, with their forward
   op) goes where that node goes;
5. anything else goes to the first worker device of the preferred type: a GPU
   when a worker has one and the op has a ``cuda`` kernel, else a CPU.

A node whose device has no kernel for its op is moved to a CPU (soft
placement, the default) or is a ``PlacementError``. Without any GPU among the
devices, explicit GPU placements fall back to CPU with one warning, unless
``strict=True``.

Examples
--------
>>> import cellgraph as cg
>>> g = cg.Graph()
>>> with g.as_default():
...     w = cg.variable([[1.0, 2.0]], name="w")
...     y = cg.reduce_sum(w * 3.0, name="y")
>>> p = cg.placement.place(g, ["/job:ps/task:0/device:cpu:0", "/job:worker/task:0/device:cpu:0"])
>>> p.device_of["w"], p.device_of["y"]
('/job:ps/task:0/device:cpu:0', '/job:worker/task:0/device:cpu:0')
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from .cells import CellgraphWarning
from .devices import KERNEL_KEY, DeviceSpec
from .errors import PlacementError
from .graph import Graph, Node
from .kernels.storage import kernel_keys

if TYPE_CHECKING:
    from cellgraph.protos import graph_pb2

Partition = tuple[str, int, int]  # (device, first row, row after the last)


# Writes to a variable that are not an optimizer's update of it (see PlacementRules._find_slots).
_PLAIN_WRITES = frozenset({"Assign", "AssignAdd"})


@dataclass
class Placement:
    """Node -> device, each with the reason, plus how split variables are cut."""

    devices: list[str]
    device_of: dict[str, str] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    ops: dict[str, str] = field(default_factory=dict)
    # A split variable (and each slot of the same shape) -> its row ranges.
    partitions: dict[str, list[Partition]] = field(default_factory=dict)
    variable_bytes: dict[str, int] = field(default_factory=dict)
    # A scalar slot (Adam's step count) of a split variable -> that variable: each partition keeps its own copy.
    scalar_slot_of: dict[str, str] = field(default_factory=dict)
    strategy: str = "greedy"
    graph_version: int = 0

    def ps_load_bytes(self) -> dict[str, int]:
        """Bytes of variables (slots included) held by each ``ps`` device."""
        load = {d: 0 for d in self.devices if DeviceSpec.parse(d).job == "ps"}
        for name, nbytes in self.variable_bytes.items():
            owner = self.scalar_slot_of.get(name)
            if owner is not None:  # one whole copy with every partition of its variable
                parts = [(device, 0, 1) for device, _, _ in self.partitions[owner]]
            else:
                parts = self.partitions.get(name) or [(self.device_of[name], 0, 1)]
            rows = parts[-1][2]
            for device, start, stop in parts:
                if device in load:
                    load[device] += nbytes * (stop - start) // rows
        return load

    def apply_to_graphdef(self, graphdef: graph_pb2.GraphDef) -> graph_pb2.GraphDef:
        """A copy of ``graphdef`` with each node's device field set from this placement."""
        from cellgraph.protos import graph_pb2

        out = graph_pb2.GraphDef()
        out.CopyFrom(graphdef)
        for proto in out.node:
            if proto.name not in self.device_of:
                raise PlacementError(
                    f"GraphDef node {proto.name!r} ({proto.op}) has no placement: this placement was made for "
                    "another graph or an older version of it; call cg.placement.place() on the graph again"
                )
            proto.device = self.device_of[proto.name]
        return out

    def __str__(self) -> str:
        rows = [("node", "op", "device", "reason")]
        rows += [(name, self.ops[name], device, self.reasons[name]) for name, device in self.device_of.items()]
        widths = [max(len(row[i]) for row in rows) for i in range(3)]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[3] for row in rows]
        lines.insert(1, "  ".join("-" * w for w in widths) + "  " + "-" * len("reason"))
        for name, parts in self.partitions.items():
            cut = ", ".join(f"rows {a}:{b} on {d}" for d, a, b in parts)
            lines.append(f"partitions of {name}: {cut}")
        for device, nbytes in self.ps_load_bytes().items():
            lines.append(f"ps load {device}: {nbytes:,} bytes")
        return "\n".join(lines)


# ----------------------------------------------------------- PS strategies
@dataclass
class PsItem:
    """One unit of PS load: a variable (or one partition of it) with its slots."""

    variable: str
    part: int
    nbytes: int
    order: int  # position of the variable in the graph


# A strategy puts each item on a ps device, given the load already there, and
# returns the devices in item order. Partitions of one variable must land on
# different devices.
Strategy = Callable[[list[PsItem], list[str], dict[str, int]], list[str]]


def greedy_by_bytes(items: list[PsItem], ps: list[str], load: dict[str, int]) -> list[str]:
    chosen: dict[int, str] = {}
    taken: dict[str, set[str]] = {}
    for i in sorted(range(len(items)), key=lambda i: (-items[i].nbytes, items[i].order, items[i].part)):
        item = items[i]
        used = taken.setdefault(item.variable, set())
        device = min((d for d in ps if d not in used), key=lambda d: load[d])
        load[device] += item.nbytes
        used.add(device)
        chosen[i] = device
    return [chosen[i] for i in range(len(items))]


def round_robin(items: list[PsItem], ps: list[str], load: dict[str, int]) -> list[str]:
    """TensorFlow's ``replica_device_setter``: the next task in graph order, whatever its load."""
    result = [""] * len(items)
    for turn, i in enumerate(sorted(range(len(items)), key=lambda i: (items[i].order, items[i].part))):
        result[i] = ps[turn % len(ps)]
        load[result[i]] += items[i].nbytes
    return result


STRATEGIES: dict[str, Strategy] = {"greedy": greedy_by_bytes, "round_robin": round_robin}


# ------------------------------------------------------------------ place
def place(
    graph: Graph,
    devices: Sequence[str],
    strategy: str = "greedy",
    soft: bool = True,
    strict: bool = False,
    split_threshold_bytes: int | None = None,
) -> Placement:
    """Decide a device for every node of ``graph``; the graph is not changed.

    Parameters
    ----------
    graph : the graph to place.
    devices : full device names, e.g. ``"/job:worker/task:0/device:gpu:0"``.
    strategy : how variables are spread over ``ps`` tasks: ``"greedy"`` (by
        bytes, largest first onto the least-loaded task) or ``"round_robin"``.
    soft : move an op whose device has no kernel for it to a CPU (recording
        why) instead of raising ``PlacementError``.
    strict : raise instead of moving explicit GPU placements to CPU when no
        GPU is among ``devices``.
    split_threshold_bytes : a variable larger than this is split along axis 0
        across ``ps`` tasks. By default, a variable larger than its fair share
        (all variable bytes / number of ``ps`` tasks), which no assignment of
        whole variables could balance.

    Examples
    --------
    >>> import cellgraph as cg
    >>> g = cg.Graph()
    >>> with g.as_default(), cg.device("/device:gpu:0"):
    ...     x = cg.placeholder((2,), name="x")
    >>> p = cg.placement.place(g, ["/job:worker/task:0/device:cpu:0", "/job:worker/task:0/device:gpu:0"])
    >>> p.device_of["x"]
    '/job:worker/task:0/device:gpu:0'
    """
    if strategy not in STRATEGIES:
        raise PlacementError(f"unknown placement strategy {strategy!r}; known: {', '.join(STRATEGIES)}")
    if split_threshold_bytes is not None and split_threshold_bytes <= 0:
        raise PlacementError(f"split_threshold_bytes must be positive, got {split_threshold_bytes}")
    placer = _Placer(graph, _parse_devices(devices), soft, strict)
    placer.placement.strategy = strategy
    placer.place_explicit()
    placer.place_variables(STRATEGIES[strategy], split_threshold_bytes)
    for node in graph.nodes:
        placer.resolve(node)
    placer.warn_gpu_fallback()
    placement = placer.placement
    # The table reads in graph order, whatever order the rules ran in.
    for table in (placement.device_of, placement.reasons, placement.ops):
        ordered = {node.name: table[node.name] for node in graph.nodes}
        table.clear()
        table.update(ordered)
    return placement


def _parse_devices(devices: Sequence[str]) -> list[DeviceSpec]:
    if isinstance(devices, str):
        raise PlacementError(f"devices must be a list of device names, not the string {devices!r}")
    if not devices:
        raise PlacementError("place() needs at least one device, e.g. ['/job:worker/task:0/device:cpu:0']")
    specs: list[DeviceSpec] = []
    for text in devices:
        spec = DeviceSpec.parse(text)
        if not spec.is_full:
            raise PlacementError(
                f"device {text!r} is partial; place() needs full names like '/job:worker/task:0/device:cpu:0'"
            )
        if spec in specs:
            raise PlacementError(f"device {text!r} is listed twice")
        specs.append(spec)
    return specs


def _nbytes(node: Node) -> int:
    value = node.attrs["initial_value"]
    return int(value.nbytes)


class _Placer:
    """The state of one ``place()`` call: what is placed so far, and the devices."""

    def __init__(self, graph: Graph, devices: list[DeviceSpec], soft: bool, strict: bool) -> None:
        self.graph = graph
        self.by_name = {n.name: n for n in graph}
        self.devices = devices
        self.soft, self.strict = soft, strict
        self.names = [str(d) for d in devices]
        self.has_gpu = any(d.device_type == "gpu" for d in devices)
        workers = [d for d in devices if d.job == "worker"] or [d for d in devices if d.job != "ps"] or devices
        self.workers = workers
        # One device per ps task: its first CPU (or its first device).
        tasks: dict[int | None, list[DeviceSpec]] = {}
        for d in devices:
            if d.job == "ps":
                tasks.setdefault(d.task, []).append(d)
        self.ps = [str(next((d for d in task if d.device_type == "cpu"), task[0])) for task in tasks.values()]
        self.placement = Placement(devices=self.names, graph_version=graph.version)
        self.in_progress: set[str] = set()
        self.gpu_fallback: list[str] = []
        self.slot_of = self._find_slots()

    # ----------------------------------------------------------- helpers
    def settle(self, node: Node, device: DeviceSpec, reason: str) -> None:
        """Record ``node`` on ``device``, after checking that its op has a kernel there."""
        device, reason = self.check_kernel(node, device, reason)
        self.placement.device_of[node.name] = str(device)
        self.placement.reasons[node.name] = reason
        self.placement.ops[node.name] = node.op

    def check_kernel(self, node: Node, device: DeviceSpec, reason: str) -> tuple[DeviceSpec, str]:
        kernels = kernel_keys(node)
        key = KERNEL_KEY[device.device_type or "cpu"]
        if key in kernels:
            return device, reason
        having = [d for d in self.devices if KERNEL_KEY[d.device_type or "cpu"] in kernels]
        if not having:
            raise PlacementError(
                f"{node.describe()}: {node.op} has no kernel for any of the devices "
                f"({', '.join(self.names)}); its kernels: {', '.join(sorted(kernels)) or 'none'}"
            )
        if not self.soft:
            raise PlacementError(
                f"{node.describe()} is placed on {device} ({reason}), but {node.op} has no {key} kernel; "
                f"devices with a kernel for {node.op}: {', '.join(str(d) for d in having)}. "
                "Place it on one of them, or pass soft=True to move it to a CPU"
            )
        same_task = [d for d in having if (d.job, d.task) == (device.job, device.task)]
        target = next((d for d in same_task + having if d.device_type == "cpu"), (same_task + having)[0])
        return target, f"{reason}; {node.op} has no {key} kernel, so soft placement moved it to {target}"

    def complete(self, node: Node, spec: DeviceSpec) -> DeviceSpec:
        """The first available device that ``spec`` matches: a worker's first, one with a kernel first."""
        ordered = self.workers + [d for d in self.devices if d not in self.workers]
        candidates = [d for d in ordered if spec.matches(d)]
        if not candidates:
            raise PlacementError(
                f"{node.describe()} asks for device {node.device!r}, which matches none of the devices: "
                f"{', '.join(self.names)}"
            )
        preferred = self.preferred_type(node, candidates)
        return next((d for d in candidates if d.device_type == preferred), candidates[0])

    def preferred_type(self, node: Node, devices: list[DeviceSpec]) -> str:
        has_gpu = any(d.device_type == "gpu" for d in devices)
        return "gpu" if has_gpu and KERNEL_KEY["gpu"] in kernel_keys(node) else "cpu"

    def _find_slots(self) -> dict[str, str]:
        """Slot variable -> the variable it serves: the other variable inputs of its update op.

        A variable an update op trains is nobody's slot. A plain write (Assign, AssignAdd) does not make it
        one: mixed precision puts every slot back as it was after a step it skips, and batch norm assigns
        its moving statistics."""
        slot_of: dict[str, str] = {}
        updated = {n.inputs[0].node.name for n in self.graph if self._updates(n) and n.op not in _PLAIN_WRITES}
        for node in self.graph:
            if self._updates(node):
                owner = node.inputs[0].node.name
                for t in node.inputs[1:]:
                    if t.node.op == "Variable" and t.node in self.graph and t.node.name not in updated:
                        slot_of.setdefault(t.node.name, owner)
        return slot_of

    def _updates(self, node: Node) -> bool:
        return (
            node.opdef.stateful
            and bool(node.inputs)
            and node.inputs[0].node.op == "Variable"
            and node.inputs[0].node in self.graph
        )

    # ------------------------------------------------------------- rules
    def place_explicit(self) -> None:
        for node in self.graph:
            if not node.device:
                continue
            try:
                spec = DeviceSpec.parse(node.device)
            except PlacementError as err:
                raise PlacementError(f"{node.describe()}: {err}") from None
            reason = f"explicit device scope {node.device!r}"
            if spec.device_type == "gpu" and not self.has_gpu:
                if self.strict:
                    raise PlacementError(
                        f"{node.describe()} asks for {node.device!r}, but no GPU is among the devices "
                        f"({', '.join(self.names)}); strict placement does not fall back to CPU "
                        "(pass strict=False to allow it)"
                    )
                spec = replace(spec, device_type="cpu", index=None)
                self.gpu_fallback.append(node.name)
                reason += "; no GPU among the devices, so on CPU"
            device = self.complete(node, spec)
            if not spec.is_full and not reason.endswith("on CPU"):
                reason += " (completed from the devices)"
            self.settle(node, device, reason)

    def place_variables(self, strategy: Strategy, threshold: int | None) -> None:
        graph, placement = self.graph, self.placement
        variables = [n for n in graph if n.op == "Variable"]
        for var in variables:
            placement.variable_bytes[var.name] = _nbytes(var)
        if not self.ps:
            return  # variables follow the default rule
        slots: dict[str, list[Node]] = {}
        for var in variables:
            if var.name in self.slot_of and var.name not in placement.device_of:
                slots.setdefault(self.slot_of[var.name], []).append(var)
        # Variables placed explicitly (and the slots that will follow them) load their tasks already.
        load = {d: 0 for d in self.ps}
        for var in variables:
            owner = self.slot_of.get(var.name, var.name)
            device = placement.device_of.get(var.name) or placement.device_of.get(owner)
            if device in load:
                load[device] += _nbytes(var)
        owners = [v for v in variables if v.name not in self.slot_of and v.name not in placement.device_of]
        if threshold is None:
            threshold = max(1, sum(_nbytes(v) for v in variables if v.name not in self.slot_of) // len(self.ps))

        items: list[PsItem] = []
        cuts: dict[str, list[tuple[int, int]]] = {}
        for order, var in enumerate(owners):
            shape = var.specs[0].shape
            rows = shape[0] if shape else 0
            nbytes = _nbytes(var)
            if nbytes > threshold and len(self.ps) > 1 and rows and rows > 1:
                count = min(len(self.ps), rows, max(2, math.ceil(nbytes / threshold)))
                cuts[var.name] = row_ranges(rows, count)
                for part, (start, stop) in enumerate(cuts[var.name]):
                    # A slot of the variable's shape is cut with it; a scalar one is copied to every part.
                    share = sum(
                        _nbytes(s) * (stop - start) // rows if s.specs[0].shape == shape else _nbytes(s)
                        for s in [var, *slots.get(var.name, [])]
                    )
                    items.append(PsItem(var.name, part, share, order))
            else:
                total = nbytes + sum(_nbytes(s) for s in slots.get(var.name, []))
                items.append(PsItem(var.name, 0, total, order))

        chosen = strategy(items, self.ps, load)
        by_var: dict[str, list[str]] = {}
        for item, device in zip(items, chosen):
            by_var.setdefault(item.variable, []).append(device)
        for var in owners:
            first = DeviceSpec.parse(by_var[var.name][0])
            nbytes = _nbytes(var)
            if var.name in cuts:
                parts = [(d, a, b) for d, (a, b) in zip(by_var[var.name], cuts[var.name])]
                placement.partitions[var.name] = parts
                where = ", ".join(f"rows {a}:{b} on {d}" for d, a, b in parts)
                reason = (
                    f"variable of {nbytes:,} bytes, over the split threshold of {threshold:,}: "
                    f"split along axis 0 into {len(parts)} partitions ({where})"
                )
            elif placement.strategy == "greedy":
                reason = f"variable of {nbytes:,} bytes: greedy by bytes, largest first onto the least-loaded ps task"
            else:
                reason = f"variable of {nbytes:,} bytes: {placement.strategy}, next ps task in turn"
            self.settle(var, first, reason)
            for slot in slots.get(var.name, []):
                if var.name in cuts and slot.specs[0].shape == var.specs[0].shape:
                    placement.partitions[slot.name] = list(placement.partitions[var.name])
                    self.settle(slot, first, f"slot of variable '{var.name}': split with it")
                elif var.name in cuts:
                    placement.scalar_slot_of[slot.name] = var.name
                    self.settle(slot, first, f"slot of variable '{var.name}': a copy with each of its partitions")
                else:
                    self.settle(slot, first, f"slot of variable '{var.name}': follows it")

    def resolve(self, node: Node) -> DeviceSpec:
        """The device of ``node``, deciding it (and what it follows) first if needed."""
        placement = self.placement
        if node.name in placement.device_of:
            return DeviceSpec.parse(placement.device_of[node.name])
        if node.name in self.in_progress:
            raise PlacementError(f"{node.describe()} is colocated with itself through a cycle of colocations")
        self.in_progress.add(node.name)
        target = node.attrs.get("_colocate")
        if node.op == "Variable" and node.name in self.slot_of:
            owner = self.by_name[self.slot_of[node.name]]
            self.settle(node, self.resolve(owner), f"slot of variable '{owner.name}': follows it")
        elif self._updates(node):
            var = node.inputs[0].node
            reason = f"updates variable '{var.name}' in place, so runs where it lives"
            if var.name in placement.partitions:
                reason += " (with its first partition; the variable is split)"
            self.settle(node, self.resolve(var), reason)
        elif isinstance(target, str) and target in self.by_name and target != node.name:
            other = self.by_name[target]
            self.settle(node, self.resolve(other), f"colocated with {other.op} '{other.name}'")
        else:
            self.settle(node, *self.default(node))
        self.in_progress.discard(node.name)
        return DeviceSpec.parse(placement.device_of[node.name])

    def default(self, node: Node) -> tuple[DeviceSpec, str]:
        preferred = self.preferred_type(node, self.workers)
        device = next((d for d in self.workers if d.device_type == preferred), self.workers[0])
        kind = device.device_type.upper() if device.device_type else "device"
        if node.op == "Variable":
            return device, f"variable, but no ps task among the devices: first worker {kind}"
        if any(d.device_type == "gpu" for d in self.workers):
            has = "has a" if preferred == "gpu" else "has no"
            return device, f"default: first worker {kind} ({node.op} {has} cuda kernel)"
        return device, f"default: first worker {kind}"

    def warn_gpu_fallback(self) -> None:
        moved = self.gpu_fallback
        if not moved:
            return
        first = ", ".join(repr(n) for n in moved[:3]) + (", ..." if len(moved) > 3 else "")
        warnings.warn(
            f"placement: {len(moved)} node(s) asked for a GPU, but no GPU is among the devices "
            f"({', '.join(self.names)}); they run on CPU instead ({first}). "
            "Pass strict=True to make this an error.",
            CellgraphWarning,
            stacklevel=3,
        )


def row_ranges(rows: int, count: int) -> list[tuple[int, int]]:
    """``count`` contiguous row ranges covering ``0:rows``, sizes differing by at most one."""
    base, extra = divmod(rows, count)
    out, start = [], 0
    for i in range(count):
        stop = start + base + (1 if i < extra else 0)
        out.append((start, stop))
        start = stop
    return out


__all__ = ["STRATEGIES", "Placement", "PsItem", "greedy_by_bytes", "place", "row_ranges"]


def __dir__() -> list[str]:
    """What ``cg.placement.<Tab>`` offers: its public names, not the modules and types it imports for itself."""
    return sorted(__all__)
