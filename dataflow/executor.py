"""The executor: compile the part of a graph a fetch needs into a plan, once.

A plan is straight-line Python generated for one (fetches, feeds) pair: the
nodes in topological order, each calling the kernel bound to it, with every
intermediate released right after its last use (so memory follows liveness).
Interpreting a node list costs a dict lookup and a loop iteration per node;
generated code costs only the kernel call. Runs of elementwise ops are fused
into one generated loop (``fusion.py``: a Numba loop on the CPU, a CUDA kernel
on a GPU), and constants are computed once, when the plan is built.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import ExecutionError, KernelNotFound, StaleNodeError
from .feeds import FeedCheck
from .fusion import find_segments, is_constant, segment_kernel
from .graph import Graph, Node, Tensor
from .kernels.cuda import fusion as cuda_fusion
from .opdef import KernelContext
from .switch_fold import Folding, fold, keep_shape
from .threads import ensure_configured
from .variables import VariableStore

_plan_ids = itertools.count()


@dataclass
class Step:
    """One call in a plan: a node's kernel, a fused segment, or a constant."""

    nodes: list[Node]
    inputs: list[Tensor]
    outputs: list[Tensor]
    kernel: Callable[..., Any]
    constant: bool = False


def _key(t: Tensor) -> tuple[int, int]:
    return (id(t.node), t.index)


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
        fuse: bool = True,
        transport: Any = None,
        ranks: dict[int, float] | None = None,
    ) -> None:
        self.graph = graph
        self.feeds = list(feeds)
        self._check_feeds = FeedCheck(self.feeds)
        self.fetches, self.order = self._schedule(list(fetches), list(targets), device, transport)
        if ranks is not None:
            # A partition follows the whole graph's order (see Partitioned.ranks);
            # the sort is stable and the ranks respect every edge, so the order
            # stays topological.
            self.order.sort(key=lambda n: ranks.get(id(n), float("inf")))
        for node in self.order:
            if node.stale:
                cell = node.cell_label or node.cell
                again = f"; re-run cell {cell}" if cell is not None else ""
                raise StaleNodeError(f"{node.describe()} is stale: {node.stale}{again}")
        ensure_configured()
        self.device = device
        ctx = KernelContext(variables, transport)
        self.kernels = [_bind(node, ctx, device, self.folding) for node in self.order]
        self.reads = [self.folding.reads(node) for node in self.order]
        self.steps = self._steps(fuse)
        self._filename = f"<cellgraph plan {next(_plan_ids)}>"
        self.source, self._line_to_step = self._generate()
        namespace: dict[str, Any] = {"_copy": np.array}
        for j, step in enumerate(self.steps):
            namespace[f"c{j}" if step.constant else f"k{j}"] = step.kernel() if step.constant else step.kernel
        exec(compile(self.source, self._filename, "exec"), namespace)  # noqa: S102 - our own generated code
        self._run: Callable[..., tuple[Any, ...]] = namespace["run"]
        self._namespace = namespace
        # The generated functions of stream() and stream_gated(), made at their first use: function, file, lines.
        self._variants: dict[str, tuple[Callable[..., tuple[Any, ...]], str, dict[int, Step]]] = {}

    def _schedule(
        self, fetches: list[Tensor], targets: list[Node], device: str, transport: Any
    ) -> tuple[list[Tensor], list[Node]]:
        """The fetches as the plan computes them, and the nodes it runs.

        A training switch that is not fed is its default: only the branch it
        takes is scheduled (switch_fold.py), and a fetch of a folded tensor
        reads the tensor that stands for it. Not in a partition (a plan with a
        transport): its Sends run whatever another partition folds, and a Recv
        folded away would leave a value queued for the next run to receive in
        place of its own.
        """
        fed = {_key(t) for t in self.feeds}
        whole = schedule(fetches, targets, self.feeds)
        self.folding = fold(whole, fed, guard=device == "cpu") if transport is None else Folding()
        resolved = [self.folding.resolve(t) for t in fetches]
        # Fetches that now alias another tensor are handed out as copies, as a view's are.
        self._copied = {i for i, t in enumerate(fetches) if resolved[i] is not t}
        if not self.folding:
            return resolved, whole
        folded = schedule(resolved, targets, self.feeds, self.folding.operands, self.folding.controls)
        # A state change on the branch not taken (an assign the where's operand depends on) still happens.
        # Ops that change state hand back the state (a view of the variable) or nothing (Send); Dropout,
        # stateful only in that each run draws a new mask, hands back a new array and is left out.
        running = {id(n) for n in folded}
        targets += [
            n for n in whole if n.opdef.stateful and (n.opdef.view or not n.specs) and n.inputs and id(n) not in running
        ]
        if self.folding.guarded:
            # An add of zeros kept as a shape check reads tensors of the zeros' shape: those computed anyway.
            needed = schedule(resolved, targets, self.feeds, self.folding.operands, self.folding.controls)
            self.folding.settle({id(n) for n in needed}, fed)
        return resolved, schedule(resolved, targets, self.feeds, self.folding.reads, self.folding.controls)

    # ------------------------------------------------------------- steps
    def _steps(self, fuse: bool) -> list[Step]:
        # A node with no inputs and no state always gives the same value:
        # compute it once, here, and let the generated code (or a fused loop) use it.
        constants: dict[tuple[int, int], Any] = {}
        for node, kernel in zip(self.order, self.kernels, strict=True):
            if is_constant(node):
                value = kernel()
                constants[_key(node.output(0))] = np.asarray(value) if self.device == "cpu" else value
        # A segment runs as one Numba loop on the CPU, as one generated kernel on a GPU.
        fused_kernel = {"cpu": segment_kernel, "cuda": cuda_fusion.segment_kernel}.get(self.device) if fuse else None
        segments = (
            find_segments(self.order, {_key(t) for t in self.fetches}, self.folding.reads, set(self.folding.guarded))
            if fused_kernel
            else []
        )
        segment_of = {id(n): seg for seg in segments for n in seg.nodes}
        kernel_of = {id(n): k for n, k in zip(self.order, self.kernels, strict=True)}
        steps: list[Step] = []
        for node, kernel, reads in zip(self.order, self.kernels, self.reads, strict=True):
            seg = segment_of.get(id(node))
            if seg is None:
                constant = _key(node.output(0)) in constants if node.specs else False
                value = constants.get(_key(node.output(0))) if constant else None
                steps.append(Step([node], reads, node.outputs, (lambda v=value: v) if constant else kernel, constant))
            elif node is seg.nodes[-1]:  # a segment runs where its output is made
                assert fused_kernel is not None
                fused = fused_kernel(seg, [kernel_of[id(n)] for n in seg.nodes], constants)
                steps.append(Step(seg.nodes, fused.inputs, [seg.output], fused))  # type: ignore[attr-defined]
        return steps

    # ------------------------------------------------------------- codegen
    def _names(self) -> dict[tuple[int, int], str]:
        names = {_key(t): f"f{i}" for i, t in enumerate(self.feeds)}
        for j, step in enumerate(self.steps):
            for i, t in enumerate(step.outputs):
                names.setdefault(_key(t), f"c{j}" if step.constant else f"v{j}_{i}")
        return names

    def _generate(self, notify: bool = False, gate: bool = False) -> tuple[str, dict[int, Step]]:
        """The plan as one Python function; with ``notify``, it calls ``_on(i, value)`` the moment fetch ``i``
        has been computed (``stream``), not only at the end; with ``gate``, ``_wait(i)`` just before the first
        kernel that reads feed ``i`` (a feed no kernel reads: before the return)."""
        names = self._names()
        fetched = {names[_key(t)] for t in self.fetches}
        last: dict[str, int] = {}
        for j, step in enumerate(self.steps):
            for t in [*step.outputs, *step.inputs]:
                last[names[_key(t)]] = j
        dying: dict[int, list[str]] = {}
        for name, j in last.items():
            if name not in fetched and name.startswith("v"):
                dying.setdefault(j, []).append(name)
        params = [f"f{i}" for i in range(len(self.feeds))] + ["_on"] * notify + ["_wait"] * gate
        lines = [f"def run({', '.join(params)}):"]  # a plan with no feeds may still stream its fetches
        unread = set(range(len(self.feeds))) if gate else set()
        fetch_indices: dict[str, list[int]] = {}
        for i, t in enumerate(self.fetches):
            fetch_indices.setdefault(names[_key(t)], []).append(i)
        line_to_step: dict[int, Step] = {}
        early: set[int] = set()  # fetches copied as they were computed
        for j, step in enumerate(self.steps):
            if step.constant:
                continue
            args = ", ".join(names[_key(t)] for t in step.inputs)
            for i in sorted(unread.intersection(_feed_indices(step, names))):
                lines.append(f"    _wait({i})")
                unread.discard(i)
            outs = [names[_key(t)] for t in step.outputs]
            call = f"k{j}({args})"
            lines.append(f"    {', '.join(outs)} = {call}" if outs else f"    {call}")
            line_to_step[len(lines)] = step
            # A fetch handed out as a copy is copied the moment it is computed: a view of a variable copied at
            # the end showed the step's update, where every other read of the variable in the step saw the value
            # before it (Session.run([identity(w), w * 1, train]) gave two different w).
            for i in (i for out in outs for i in fetch_indices.get(out, [])):
                if self._copies(i):
                    lines.append(f"    _fetch{i} = _copy({names[_key(self.fetches[i])]})")
                    early.add(i)
                if notify:
                    lines.append(f"    _on({i}, {f'_fetch{i}' if i in early else names[_key(self.fetches[i])]})")
            if dying.get(j):
                lines.append(f"    del {', '.join(dying[j])}")
        lines += [f"    _wait({i})" for i in sorted(unread)]
        results = []
        for i, t in enumerate(self.fetches):
            name = names[_key(t)]
            results.append(f"_fetch{i}" if i in early else f"_copy({name})" if self._copies(i) else name)
        lines.append(f"    return ({', '.join(results)}{',' if results else ''})")
        return "\n".join(lines) + "\n", line_to_step

    def _copies(self, i: int) -> bool:
        """Fetch ``i`` is handed out as a copy: a view may alias a variable or a constant, a folded
        fetch (or an add of zeros kept as its operand) another fetch, and a fed tensor the caller's own
        array, which a data loader refills in place (on the CPU: ``_copy`` makes a host array, and a
        device plan hands out device arrays)."""
        t = self.fetches[i]
        folded = i in self._copied or id(t.node) in self.folding.guarded
        fed = any(_key(t) == _key(f) for f in self.feeds)
        return t.node.opdef.view or ((folded or fed) and self.device == "cpu")

    # ----------------------------------------------------------------- run
    def __call__(self, *feed_values: np.ndarray) -> tuple[Any, ...]:
        """The fetches for ``feed_values`` (in the plan's feed order), each checked as ``Session.run`` checks it."""
        feed_values = tuple(self._check_feeds(feed_values))
        try:
            return self._run(*feed_values)
        except Exception as exc:
            step = self._failed_step(exc)
            if step is None:
                raise
            raise ExecutionError(_failure(step, exc)) from exc

    def stream(self, on_fetch: Callable[[int, Any], None], *feed_values: np.ndarray) -> tuple[Any, ...]:
        """Run like ``__call__``, and call ``on_fetch(i, value)`` as soon as fetch ``i`` is computed.

        A replica uses it to send each gradient while backprop goes on. The
        values are the ones returned at the end (views copied once); the
        callback runs on this thread, between kernels.

        Examples
        --------
        >>> import cellgraph as cg
        >>> g = cg.Graph()
        >>> with g.as_default():
        ...     x = cg.placeholder((2,), name="x")
        ...     y = x * 2.0
        ...     z = y + 1.0
        >>> seen = []
        >>> plan = cg.Session(g, fuse=False).make_callable([z, y], [x])
        >>> _ = plan.stream(lambda i, v: seen.append(i), np.ones(2, np.float32))
        >>> seen  # y (fetch 1) is ready before z (fetch 0)
        [1, 0]
        """
        return self._run_variant("streaming", *self._check_feeds(feed_values), on_fetch)

    def stream_gated(
        self, on_fetch: Callable[[int, Any], None], before_use: Callable[[int], None], *feed_values: np.ndarray
    ) -> tuple[Any, ...]:
        """``stream``, calling ``before_use(i)`` just before the first kernel that reads feed ``i``.

        A replica's next step starts while its variables are still arriving
        from the parameter servers: each feed is waited for where it is first
        needed, so the first layers compute while the last ones' values are on
        the wire.

        Examples
        --------
        >>> import cellgraph as cg
        >>> g = cg.Graph()
        >>> with g.as_default():
        ...     x = cg.placeholder((2,), name="x")
        ...     w = cg.placeholder((2,), name="w")
        ...     z = (x * 2.0) * w
        >>> seen = []
        >>> plan = cg.Session(g, fuse=False).make_callable([z], [x, w])
        >>> _ = plan.stream_gated(lambda i, v: seen.append(f"fetch {i}"), lambda i: seen.append(f"feed {i}"),
        ...                       np.ones(2, np.float32), np.ones(2, np.float32))
        >>> seen  # w (feed 1) is waited for only when x * 2 is done and the product needs it
        ['feed 0', 'feed 1', 'fetch 0']
        """
        return self._run_variant("gated", *self._check_feeds(feed_values), on_fetch, before_use)

    def _run_variant(self, variant: str, *args: Any) -> tuple[Any, ...]:
        """Run the generated function ``variant`` ("streaming": with ``_on``; "gated": with ``_on`` and
        ``_wait``), made at its first use; a kernel's failure names its node, as ``__call__``'s does."""
        made = self._variants.get(variant)
        if made is None:
            source, lines = self._generate(notify=True, gate=variant == "gated")
            filename = f"{self._filename[:-1]} {variant}>"
            namespace = dict(self._namespace)
            exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - our own generated code
            made = self._variants[variant] = (namespace["run"], filename, lines)
        run, filename, lines = made
        try:
            return run(*args)
        except Exception as exc:
            step = _failed_step_in(exc, filename, lines)
            if step is None:
                raise
            raise ExecutionError(_failure(step, exc)) from exc

    def _failed_step(self, exc: BaseException) -> Step | None:
        return _failed_step_in(exc, self._filename, self._line_to_step)

    def trace(self, *feed_values: np.ndarray) -> tuple[tuple[Any, ...], int]:
        """Run node by node, unfused; return the fetches and the largest live set in bytes.

        The live set after a node is the buffers its live tensors (computed and
        not past their last use, or fetched) hold, each counted once: a view (a
        reshape) holds its input's buffer for as long as the view lives, and an
        op that may return a view but copied (a transpose) owns its copy.
        Buffers that outlive the run (feeds, variables, constants, the state an
        op returns) are not counted. What remains is the lower bound that any
        buffer reuse can reach in this order.
        """
        env: dict[tuple[int, int], Any] = {_key(t): v for t, v in zip(self.feeds, feed_values, strict=True)}
        last: dict[tuple[int, int], int] = {}
        for j, (node, reads) in enumerate(zip(self.order, self.reads, strict=True)):
            for t in [*node.outputs, *reads]:
                last[_key(t)] = j
        fetched = {_key(t) for t in self.fetches}
        # env keeps every value to the end, so no id below is reused by another array during the run.
        outside = {id(_buffer(v)) for v in feed_values if isinstance(v, np.ndarray)}
        live: dict[tuple[int, int], np.ndarray] = {}
        peak = 0
        for j, (node, kernel, reads) in enumerate(zip(self.order, self.kernels, self.reads, strict=True)):
            result = kernel(*(env[_key(t)] for t in reads))
            outs = result if len(node.specs) > 1 else (result,) if node.specs else ()
            for t, value in zip(node.outputs, outs, strict=True):
                env[_key(t)] = value
                if not isinstance(value, np.ndarray):
                    continue
                if not node.inputs or node.opdef.stateful:  # a constant, a variable, or the state an op changed
                    outside.add(id(_buffer(value)))
                else:
                    live[_key(t)] = value
            held = {id(b): b.nbytes for b in map(_buffer, live.values()) if id(b) not in outside}
            peak = max(peak, sum(held.values()))
            for key in [k for k in live if last.get(k, -1) <= j and k not in fetched]:
                del live[key]
        return tuple(env[_key(t)] for t in self.fetches), peak


def _buffer(value: np.ndarray) -> np.ndarray:
    """The array that owns ``value``'s memory (``value`` itself unless it is a view)."""
    while isinstance(value.base, np.ndarray):
        value = value.base
    return value


def _failure(step: Step, exc: BaseException) -> str:
    what = step.nodes[-1].describe()
    if len(step.nodes) > 1:
        what += f" (fused with {len(step.nodes) - 1} elementwise ops before it)"
    return f"{what} failed while running: {type(exc).__name__}: {exc}"


def _failed_step_in(exc: BaseException, filename: str, line_to_step: dict[int, Step]) -> Step | None:
    """The step of generated code ``filename`` whose line raised ``exc``, if it was one."""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == filename:
            return line_to_step.get(tb.tb_lineno)
        tb = tb.tb_next
    return None


def _feed_indices(step: Step, names: dict[tuple[int, int], str]) -> list[int]:
    """The feeds ``step``'s kernel reads (feed ``i`` is named ``f{i}`` in the generated code)."""
    return [int(name[1:]) for name in (names[_key(t)] for t in step.inputs) if name.startswith("f")]


def _bind(node: Node, ctx: KernelContext, device: str, folding: Folding) -> Callable[..., Any]:
    if id(node) in folding.guarded:
        return keep_shape
    opdef = node.opdef
    factory = opdef.kernels.get(device)
    if factory is None:
        have = ", ".join(sorted(opdef.kernels)) or "none"
        raise KernelNotFound(f"{node.describe()} has no {device} kernel; kernels exist for: {have}")
    return factory(node, ctx)


def schedule(
    fetches: list[Tensor],
    targets: list[Node],
    feeds: list[Tensor],
    reads: Callable[[Node], list[Tensor]] | None = None,
    controls: Callable[[Node], list[Node]] | None = None,
) -> list[Node]:
    """Nodes the fetches and targets need, inputs first; fed tensors cut the graph. ``reads`` and
    ``controls`` give the tensors a node's step reads and the nodes it waits for (default: its inputs and
    control inputs; a plan's ``Folding`` leaves some out)."""
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
            deps = [t.node for t in (reads(node) if reads else node.inputs) if (id(t.node), t.index) not in fed]
            # A fed placeholder waited for by control (an optimizer's gradients_ready, when a gradient is fed)
            # has its value already: scheduled, its kernel failed the run with "needs a value".
            waits = controls(node) if controls else node.control_inputs
            deps += [c for c in waits if not (c.op == "Placeholder" and (id(c), 0) in fed)]
            for dep in reversed(deps):
                if not state.get(id(dep)):
                    stack.append((dep, False))
                elif state[id(dep)] == 1:  # on the current path: a back edge
                    raise ExecutionError(f"the graph has a cycle through {dep.describe()}")
    return order
