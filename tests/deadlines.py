"""A deadline that only bounds a hang: the tests assert what a call did, never how long it took."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def unless_it_hangs(call: Callable[[], T], hang_s: float, what: str) -> T:
    """``call()``'s result (or its exception, raised here), run on a daemon thread so that a hang fails the test.

    ``hang_s`` is no performance bound: make it far longer than the call can take when it works.
    """
    outcome: list[T] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as err:  # raised again below, in the test's thread
            error.append(err)

    thread = threading.Thread(target=run, name=f"unless-it-hangs: {what}", daemon=True)
    thread.start()
    thread.join(hang_s)
    if thread.is_alive():
        raise AssertionError(f"{what}: still running after {hang_s} s; it hangs")
    if error:
        raise error[0]
    return outcome[0]
