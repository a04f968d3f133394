"""One call over several shards: the first failure is the news, and the other shards' calls are cancelled.

A ``ParameterClient`` runs a call on every shard in parallel; a live shard may
wait for a step that a failed one will never let happen, so the caller needs
the failure at once, not at the live shard's deadline. Each shard's call runs
with the fan-out in ``FAN_OUT.scope`` (thread-local) and registers its gRPC
call there, so that the first failure cancels the rest.

Examples
--------
>>> scope = FanOut()
>>> scope.fail(ValueError("shard 1 is gone")); scope.fail(ValueError("a later one"))
>>> str(scope.error), scope.failed.is_set()
('shard 1 is gone', True)
"""

from __future__ import annotations

import threading

import grpc

# How long a failed fan-out waits for the other shards' cancelled calls to end before it raises, at most.
CANCEL_WAIT_S = 1.0


class FanOut:
    """The calls of one fan-out over shards: the first failure is kept, and the other calls are cancelled."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.failed = threading.Event()
        self.error: BaseException | None = None
        self.calls: set[grpc.Call] = set()

    def track(self, call: grpc.Call) -> None:
        with self.lock:
            self.calls.add(call)
        if self.failed.is_set():
            call.cancel()

    def untrack(self, call: grpc.Call) -> None:
        with self.lock:
            self.calls.discard(call)

    def fail(self, error: BaseException) -> None:
        with self.lock:
            if self.error is not None:
                return  # a later failure, or a cancelled call's: the first one is the news
            self.error, calls = error, list(self.calls)
            self.failed.set()
        for call in calls:
            call.cancel()


# The fan-out the current thread is working for (None outside one: a single-shard call runs on the caller's thread).
FAN_OUT = threading.local()


def current_fan_out() -> FanOut | None:
    return getattr(FAN_OUT, "scope", None)


class Cancellable:
    """A unary-response multi-callable that a fan-out can cancel: inside one, the call runs as a future."""

    def __init__(self, method: grpc.UnaryUnaryMultiCallable | grpc.StreamUnaryMultiCallable) -> None:
        self.method = method

    def __call__(self, request: object, *, timeout: float, metadata: object) -> object:
        scope = current_fan_out()
        if scope is None:
            return self.method(request, timeout=timeout, metadata=metadata)
        future = self.method.future(request, timeout=timeout, metadata=metadata)
        scope.track(future)
        try:
            return future.result()
        except grpc.FutureCancelledError:
            raise Cancelled() from None
        finally:
            scope.untrack(future)


class Cancelled(Exception):
    """A shard's call cancelled because another shard of the same fan-out failed (its error is the one raised)."""
