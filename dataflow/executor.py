"""The executor: compile the part of a graph a fetch needs into a plan, once.

A plan is straight-line Python generated for one (fetches, feeds) pair: the
nodes in topological order, each calling the kernel bound to it, with every
intermediate released right after its last use (so memory follows liveness).
Interpreting a node list costs a dict lookup and a loop iteration per node;
generated code costs only the kernel call, which is what the per-node overhead
benchmark measures.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .errors import ExecutionError, KernelNotFound, StaleNodeError
from .graph import Graph, Node, Tensor
from .opdef import KernelContext
from .threads import ensure_configured
from .variables import VariableStore

_plan_ids = itertools.count()


class Plan:
    """A compiled, reusable run of one graph for fixed fetches and feeds."""

    def __init__(
        self,
        graph: Graph,
        fetches: Sequence[Tensor],
        targets: Sequence[Node],
        feeds: Sequence[Tensor],
        variables: VariableStore,
        device: str = "cpu",
    ) -> None:
        self.graph = graph
        self.fetches = list(fetches)
        self.feeds = list(feeds)
        self.order = _schedule(self.fetches, list(targets), self.feeds)
        for node in self.order:
            if node.stale:
                cell = node.cell_label or node.cell
                again = f"; re-run cell {cell}" if cell is not None else ""
                raise StaleNodeError(f"{node.describe()} is stale: {node.stale}{again}")
        ensure_configured()
        ctx = KernelContext(variables)
        self.kernels = [_bind(node, ctx, device) for node in self.order]
        self._filename = f"<cellgraph plan {next(_plan_ids)}>"
        self.source, self._line_to_node = self._generate()
        namespace: dict[str, Any] = {f"k{i}": k for i, k in enumerate(self.kernels)}
        namespace["_copy"] = np.array
        exec(compile(self.source, self._filename, "exec"), namespace)  # noqa: S102 - our own generated code
        self._run: Callable[..., tuple[Any, ...]] = namespace["run"]

    # ------------------------------------------------------------- codegen
    def _names(self) -> dict[tuple[int, int], str]:
        names = {(id(t.node), t.index): f"f{i}" for i, t in enumerate(self.feeds)}
        for j, node in enumerate(self.order):
            for i in range(len(node.specs)):
                names.setdefault((id(node), i), f"v{j}_{i}")
        return names

    def last_uses(self) -> dict[str, int]:
        """For each value name, the index in ``order`` of its last consumer."""
        names = self._names()
        last: dict[str, int] = {}
        for j, node in enumerate(self.order):
            for i in range(len(node.specs)):
                last.setdefault(names[(id(node), i)], j)
            for t in node.inputs:
                last[names[(id(t.node), t.index)]] = j
        return last

    def _generate(self) -> tuple[str, dict[int, Node]]:
        names = self._names()
        fetched = {names[(id(t.node), t.index)] for t in self.fetches}
        last = self.last_uses()
        dying: dict[int, list[str]] = {}
        for name, j in last.items():
            if name not in fetched and not name.startswith("f"):
                dying.setdefault(j, []).append(name)
        params = ", ".join(f"f{i}" for i in range(len(self.feeds)))
        lines = [f"def run({params}):"]
        line_to_node: dict[int, Node] = {}
        for j, node in enumerate(self.order):
            args = ", ".join(names[(id(t.node), t.index)] for t in node.inputs)
            outs = [names[(id(node), i)] for i in range(len(node.specs))]
            call = f"k{j}({args})"
            if not outs:
                lines.append(f"    {call}")
            elif len(outs) == 1:
                lines.append(f"    {outs[0]} = {call}")
            else:
                lines.append(f"    {', '.join(outs)} = {call}")
            line_to_node[len(lines)] = node
            if dying.get(j):
                lines.append(f"    del {', '.join(dying[j])}")
        results = []
        for t in self.fetches:
            name = names[(id(t.node), t.index)]
            # A view may alias a variable or a constant: hand out a copy.
            results.append(f"_copy({name})" if t.node.opdef.view else name)
        lines.append(f"    return ({', '.join(results)}{',' if results else ''})")
        return "\n".join(lines) + "\n", line_to_node

    # ----------------------------------------------------------------- run
    def __call__(self, *feed_values: np.ndarray) -> tuple[Any, ...]:
        try:
            return self._run(*feed_values)
        except Exception as exc:
            node = self._failed_node(exc)
            if node is None:
                raise
            raise ExecutionError(f"{node.describe()} failed while running: {type(exc).__name__}: {exc}") from exc

    def _failed_node(self, exc: BaseException) -> Node | None:
        tb = exc.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code.co_filename == self._filename:
                return self._line_to_node.get(tb.tb_lineno)
            tb = tb.tb_next
        return None

    def trace(self, *feed_values: np.ndarray) -> tuple[tuple[Any, ...], int]:
        """Run node by node; return the fetches and the largest live set in bytes.

        Counts only buffers the plan owns (not feeds, variables, constants or
        views), which is the lower bound that any buffer reuse can reach.
        """
        names = self._names()
        env: dict[str, Any] = {f"f{i}": v for i, v in enumerate(feed_values)}
        owned: dict[str, int] = {}
        fetched = {names[(id(t.node), t.index)] for t in self.fetches}
        last = self.last_uses()
        peak = 0
        for j, (node, kernel) in enumerate(zip(self.order, self.kernels)):
            result = kernel(*(env[names[(id(t.node), t.index)]] for t in node.inputs))
            outs = result if len(node.specs) > 1 else (result,) if node.specs else ()
            for i, value in enumerate(outs):
                name = names[(id(node), i)]
                env[name] = value
                if not node.opdef.view and isinstance(value, np.ndarray):
                    owned[name] = value.nbytes
            peak = max(peak, sum(owned.values()))
            for name in [n for n in owned if last.get(n, -1) <= j and n not in fetched]:
                del owned[name]
        results = tuple(env[names[(id(t.node), t.index)]] for t in self.fetches)
        return results, peak


def _bind(node: Node, ctx: KernelContext, device: str) -> Callable[..., Any]:
    opdef = node.opdef
    factory = opdef.kernels.get(device)
    if factory is None:
        have = ", ".join(sorted(opdef.kernels)) or "none"
        raise KernelNotFound(f"{node.describe()} has no {device} kernel; kernels exist for: {have}")
    return factory(node, ctx)


def _schedule(fetches: list[Tensor], targets: list[Node], feeds: list[Tensor]) -> list[Node]:
    """Nodes the fetches and targets need, inputs first; fed tensors cut the graph."""
    fed = {(id(t.node), t.index) for t in feeds}
    order: list[Node] = []
    state: dict[int, int] = {}  # 1 = on the stack, 2 = done
    roots: list[Node] = [t.node for t in fetches if (id(t.node), t.index) not in fed] + targets
    for root in roots:
        if state.get(id(root)) == 2:
            continue
        stack: list[tuple[Node, bool]] = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            if expanded:
                state[id(node)] = 2
                order.append(node)
                continue
            if state.get(id(node)):
                continue
            state[id(node)] = 1
            stack.append((node, True))
            deps = [t.node for t in node.inputs if (id(t.node), t.index) not in fed]
            deps += node.control_inputs
            for dep in reversed(deps):
                if not state.get(id(dep)):
                    stack.append((dep, False))
                elif state[id(dep)] == 1:  # on the current path: a back edge
                    raise ExecutionError(f"the graph has a cycle through {dep.describe()}")
    return order
