"""Send and Recv: where a partitioned graph crosses from one device to another.

``cg.partition`` inserts one pair per tensor per destination device. Their
kernels call the session's ``Transport`` (``dataflow/transport.py``): a queue
inside one process, gRPC between machines once the cluster issue lands. They
have no NumPy reference of their own: what a Recv yields is whatever its Send
was given, which ``tests/dataflow/test_partition.py`` checks end to end.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import ExecutionError
from ..graph import Graph, Node, Tensor
from ..opdef import KernelContext, OpDef, TensorSpec, not_differentiable, register_op

FAMILY = "transfer"
# How long a Recv waits for its Send before it says who did not answer.
DEFAULT_TIMEOUT_S = 60.0


def _transport(node: Node, ctx: KernelContext) -> Any:
    if ctx.transport is None:
        raise ExecutionError(f"{node.describe()} needs a transport: run partitioned graphs with cg.PartitionedSession")
    return ctx.transport


def _send_kernel(node: Node, ctx: KernelContext) -> Callable[[np.ndarray], tuple[()]]:
    transport, key = _transport(node, ctx), node.attrs["key"]

    def send(x: np.ndarray) -> tuple[()]:
        transport.send(key, x)
        return ()

    return send


def _recv_kernel(node: Node, ctx: KernelContext) -> Callable[[], np.ndarray]:
    transport, key, timeout = _transport(node, ctx), node.attrs["key"], node.attrs["timeout"]
    src, dst = node.attrs["src_device"], node.attrs["dst_device"]

    def recv() -> np.ndarray:
        try:
            return transport.recv(key, timeout)
        except ExecutionError as err:
            raise ExecutionError(f"{err} (waiting on {dst} for {src})") from None

    return recv


def _no_reference(attrs: dict[str, Any], *inputs: np.ndarray) -> Any:
    raise NotImplementedError("Send/Recv move values between partitions; they compute nothing of their own")


def _send_from_gpu(node: Node, ctx: KernelContext) -> Callable[[Any], tuple[()]]:
    # A device boundary: the only place a tensor leaves the GPU. The copy is queued and the Send returns: the sender
    # thread hands the value over once copied (kernels/cuda/staging.py), and the partition's run waits for it at its end.
    from ..kernels.cuda import staging

    send_host = _send_kernel(node, ctx)

    def send(x: Any) -> tuple[()]:
        staging.send_async(x, send_host)
        return ()

    return send


def _recv_on_gpu(node: Node, ctx: KernelContext) -> Callable[[], Any]:
    from ..kernels.cuda import staging

    recv_host = _recv_kernel(node, ctx)
    return lambda: staging.to_device(recv_host())


register_op(OpDef(
    name="Send", strings=True, family=FAMILY, infer=lambda ctx: [], reference=_no_reference,
    grad=not_differentiable, kernels={"cpu": _send_kernel, "cuda": _send_from_gpu}, stateful=True,
))  # fmt: skip
register_op(OpDef(
    name="Recv", strings=True, family=FAMILY,
    infer=lambda ctx: TensorSpec(tuple(ctx.attrs["shape"]), ctx.attrs["dtype"]),
    reference=_no_reference, grad=not_differentiable, kernels={"cpu": _recv_kernel, "cuda": _recv_on_gpu},
    # Stateful: a Recv has no inputs but must run every time, never be folded into a constant.
    stateful=True,
))  # fmt: skip


def send(x: Tensor, key: str, src_device: str, dst_device: str, graph: Graph) -> Node:
    """A Send of ``x`` under ``key`` (made by ``cg.partition``, rarely by hand)."""
    attrs = {"key": key, "src_device": src_device, "dst_device": dst_device}
    return graph.create_node("Send", [x], attrs, name=f"send/{_safe(key)}")


def recv(
    spec: TensorSpec, key: str, src_device: str, dst_device: str, graph: Graph, timeout: float = DEFAULT_TIMEOUT_S
) -> Tensor:
    """The Recv matching a Send of ``key``; waits at most ``timeout`` seconds per run."""
    attrs = {
        "key": key, "shape": spec.shape, "dtype": spec.dtype,
        "src_device": src_device, "dst_device": dst_device, "timeout": float(timeout),
    }  # fmt: skip
    return graph.create_node("Recv", [], attrs, name=f"recv/{_safe(key)}").output(0)


def _safe(key: str) -> str:
    return "".join(c if c.isalnum() or c in "_-" else "_" for c in key)


__all__: list[str] = []  # built by cg.partition, not by users
