"""Running a partitioned graph: one plan per device, all in one process.

Each device's subgraph compiles to its own plan (CPU kernels now; CUDA ones
with the devices issue), the plans run concurrently on threads (kernels drop
the GIL), and Send/Recv pairs meet in the transport. A failing partition
cancels the transport so no other partition waits out its deadline.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from .devices import KERNEL_KEY, DeviceSpec
from .errors import ExecutionError
from .executor import Plan, schedule
from .graph import Graph, Node, Tensor
from .ops.transfer import DEFAULT_TIMEOUT_S
from .partition import Partitioned, partition
from .session import checked_seed, convert_feed, feed_tensor, flatten_fetches, resolve_fetch
from .transport import InProcessTransport
from .variables import VariableStore


def kernel_key(device: str) -> str:
    """The ``OpDef.kernels`` key of a device name: "cpu", or "cuda" for a GPU."""
    return KERNEL_KEY[DeviceSpec.parse(device).device_type or "cpu"]


class PartitionedSession:
    """Like ``Session``, but over the per-device partitions of ``graph``.

    Examples
    --------
    >>> import cellgraph as cg
    >>> g = cg.Graph()
    >>> with g.as_default():
    ...     w = cg.variable([1.0, 2.0], name="w")
    ...     y = cg.reduce_sum(w * 3.0, name="y")
    >>> ps, worker = "/job:ps/task:0/device:cpu:0", "/job:worker/task:0/device:cpu:0"
    >>> sess = cg.PartitionedSession(g, {n.name: ps if n.name == "w" else worker for n in g.nodes})
    >>> float(sess.run(y))
    9.0
    """

    def __init__(
        self,
        graph: Graph,
        placement: Any,
        transport: InProcessTransport | None = None,
        fuse: bool = True,
        timeout: float = DEFAULT_TIMEOUT_S,
        *,
        seed: int | None = None,
    ) -> None:
        self.graph = graph
        self.placement = placement
        self.timeout = timeout
        self.fuse = fuse
        self.transport = transport or InProcessTransport()
        # Partitions of an interrupted run that had not stopped when it returned (a second Ctrl-C): the next run
        # waits for them before it resets the transport (_settle).
        self._unfinished: list[concurrent.futures.Future[dict[str, Any]]] = []
        # One store for every partition: in one process, a variable is one array.
        # ``seed``: as Session's, mixed into every random op's seed.
        self.variables = VariableStore(checked_seed(seed, "PartitionedSession"))
        self.parts: Partitioned = partition(graph, placement, timeout)
        self._plans: dict[tuple[Any, ...], dict[str, Plan]] = {}

    def run(self, fetches: Any, feed_dict: Mapping[Tensor | str, Any] | None = None) -> Any:
        """Compute ``fetches`` (same forms as ``Session.run``) across every partition."""
        return self._run(fetches, feed_dict, None)

    def stream(
        self, fetches: list[Tensor], feed_dict: Mapping[Tensor | str, Any], on_fetch: Callable[[int, Any], None]
    ) -> list[Any]:
        """``run`` for a list of tensors, calling ``on_fetch(i, value)`` as soon as fetch ``i`` is computed.

        A GPU replica sends each gradient while backprop goes on: a fetch
        computed on the GPU is copied to the host on the copy stream while the
        partition goes on launching kernels, and handed over (a host array) by
        the sender thread once copied; a CPU partition's fetch is handed over
        between its kernels, on its thread; one that no kernel computes (a fed
        tensor) at the end. So ``on_fetch`` may be called from several threads,
        one call at a time per thread.

        >>> import cellgraph as cg
        >>> g = cg.Graph()
        >>> with g.as_default():
        ...     x = cg.placeholder((2,), name="x")
        ...     halved = cg.mul(x, 0.5, name="halved")
        >>> sess = cg.PartitionedSession(g, {n.name: "/job:worker/task:0/device:cpu:0" for n in g.nodes})
        >>> handed = []
        >>> [v.tolist() for v in sess.stream([halved, x], {x: np.ones(2, np.float32)}, lambda i, v: handed.append(i))]
        [[0.5, 0.5], [1.0, 1.0]]
        >>> sorted(handed)
        [0, 1]
        """
        return list(self._run(fetches, feed_dict, on_fetch))

    def _run(
        self,
        fetches: Any,
        feed_dict: Mapping[Tensor | str, Any] | None,
        on_fetch: Callable[[int, Any], None] | None,
    ) -> Any:
        if self.graph.version != self.parts.version:
            self.parts = partition(self.graph, self.placement, self.timeout)
            self._plans.clear()
        self.variables.sync(self.graph)
        flat: list[Any] = []
        rebuild = flatten_fetches(fetches, flat)
        resolved = [resolve_fetch(self.graph, f) for f in flat]
        feeds = {feed_tensor(self.graph, k): v for k, v in (feed_dict or {}).items()}
        values = {t.name: convert_feed(t, v) for t, v in feeds.items()}
        plans = self._plans_for(resolved, list(feeds))
        by_name: dict[str, list[int]] = {}  # a tensor's positions among the fetches (it may be fetched twice)
        for i, r in enumerate(resolved):
            if isinstance(r, Tensor):
                by_name.setdefault(r.name, []).append(i)
        handed = None
        announced: set[str] = set()  # fetches handed over as they were computed
        if on_fetch is not None:
            report = on_fetch

            def handed(name: str, value: Any) -> None:
                if name in announced:  # a tensor fetched twice is one fetch of its plan per position: once is all
                    return
                announced.add(name)
                for i in by_name[name]:
                    report(i, value)

        results = self._run_all(plans, values, handed)
        out: list[Any] = []
        for r in resolved:
            if isinstance(r, Node):
                out.append(None)
            else:
                device = self.parts.device_of[r.node.name]
                out.append(results[device][r.name])
        if on_fetch is not None:  # what no kernel computed (a fed tensor, fetched) is handed over at the end
            for i, (r, value) in enumerate(zip(resolved, out)):
                if isinstance(r, Tensor) and r.name not in announced:
                    on_fetch(i, value)
        return rebuild(iter(out))

    def _plans_for(self, resolved: list[Tensor | Node], feeds: list[Tensor]) -> dict[str, Plan]:
        key = (tuple(id(r) for r in resolved), tuple(sorted(t.name for t in feeds)))
        if key in self._plans:
            return self._plans[key]
        parts = self.parts
        tensors = [r for r in resolved if isinstance(r, Tensor)]
        targets = [r for r in resolved if isinstance(r, Node)]
        whole = schedule(tensors, targets, feeds)
        needed = {n.name for n in whole}
        ranks = parts.ranks(whole)
        plans: dict[str, Plan] = {}
        for device, g in parts.graphs.items():
            dev_fetches = [parts.copy_of(t) for t in tensors if parts.device_of[t.node.name] == device]
            dev_targets = [parts.copies[n.name] for n in targets if parts.device_of[n.name] == device]
            dev_targets += [e.send for e in parts.edges if e.src == device and e.consumers & needed]
            dev_feeds = [parts.copy_of(t) for t in feeds if parts.device_of[t.node.name] == device]
            if dev_fetches or dev_targets:
                plan = Plan(
                    g,
                    dev_fetches,
                    dev_targets,
                    dev_feeds,
                    self.variables,
                    device=kernel_key(device),
                    fuse=self.fuse,
                    transport=self.transport,
                    ranks=ranks,
                )
                plan.fetch_names = [t.name for t in tensors if parts.device_of[t.node.name] == device]  # type: ignore[attr-defined]
                plan.feed_names = [t.name for t in feeds if parts.device_of[t.node.name] == device]  # type: ignore[attr-defined]
                plans[device] = plan
        self._plans[key] = plans
        return plans

    def _settle(self) -> None:
        """Before a run: the partitions of an interrupted run that were still running have stopped; start afresh."""
        if not self._unfinished:
            return
        _, late = concurrent.futures.wait(self._unfinished, timeout=self.timeout)
        if late:
            raise ExecutionError(
                f"{len(late)} partition(s) of an interrupted run are still running after {self.timeout:g} s"
            )
        self._unfinished = []
        self.transport.reset()

    def _run_all(
        self, plans: dict[str, Plan], values: dict[str, Any], on_fetch: Callable[[str, Any], None] | None = None
    ) -> dict[str, dict[str, Any]]:
        def run_one(plan: Plan) -> dict[str, Any]:
            names: list[str] = plan.fetch_names  # type: ignore[attr-defined]
            feeds = [values[name] for name in plan.feed_names]  # type: ignore[attr-defined]
            if plan.device == "cpu":
                if on_fetch is None:
                    return dict(zip(names, plan(*feeds), strict=True))
                return dict(zip(names, plan.stream(lambda i, v: on_fetch(names[i], v), *feeds), strict=True))
            # Feeds and fetches cross the device boundary here, through pinned buffers.
            from .kernels.cuda import staging

            copied: dict[int, Any] = {}  # fetches handed over as they were computed: their host copies

            def copy_out(i: int, value: Any) -> None:  # between kernels, on this thread
                assert on_fetch is not None
                if not hasattr(value, "copy_to_host"):
                    on_fetch(names[i], value)
                    return

                def deliver(buffer: np.ndarray) -> None:  # on the sender thread, once copied
                    host = copied[i] = buffer.copy()  # the pinned buffer is lent again after this returns
                    on_fetch(names[i], host)

                staging.send_async(value, deliver)

            feeds = [staging.to_device(v) for v in feeds]
            try:
                outputs = plan(*feeds) if on_fetch is None else plan.stream(copy_out, *feeds)
            except BaseException:
                staging.wait_sent(report=False)  # its Sends land (or are dropped) before the run ends; its
                raise  # own error is the one to report
            staging.wait_sent()  # the partition's Sends and streamed fetches are delivered before its run ends
            host = [
                copied[i] if i in copied else staging.to_host(o) if hasattr(o, "copy_to_host") else o
                for i, o in enumerate(outputs)
            ]
            return dict(zip(names, host, strict=True))

        if len(plans) == 1:
            [(device, plan)] = plans.items()
            return {device: run_one(plan)}
        results: dict[str, dict[str, Any]] = {}
        errors: list[tuple[str, BaseException]] = []
        self._settle()
        cancelled = False
        futures: dict[concurrent.futures.Future[dict[str, Any]], str] = {}
        try:
            with concurrent.futures.ThreadPoolExecutor(len(plans), thread_name_prefix="partition") as pool:
                try:
                    for device, plan in plans.items():  # one by one: an interrupt here leaves those started known
                        futures[pool.submit(run_one, plan)] = device
                    for future in concurrent.futures.as_completed(futures):
                        device = futures[future]
                        try:
                            results[device] = future.result()
                        except BaseException as err:  # noqa: BLE001 - reported below, with the device
                            if not cancelled:
                                # Wake every partition still waiting on a Recv from this one.
                                self.transport.cancel(f"the partition on {device} failed")
                                cancelled = True
                            errors.append((device, err))
                except BaseException:  # an interrupt (Ctrl-C in a notebook): stop the partitions now, not at their end
                    if not cancelled:
                        self.transport.cancel("the run was interrupted")
                        cancelled = True
                    raise
        finally:
            if cancelled:
                # What the partitions sent after the cancel was dropped. Once every one has stopped (the pool waits
                # for them, unless a second interrupt cut that short), the next run starts with no queue.
                self._unfinished = [future for future in futures if not future.done()]
                if not self._unfinished:
                    self.transport.reset()
        if errors:
            failed, first = errors[0]
            raise ExecutionError(f"the partition on {failed} failed: {first}") from first
        return results
