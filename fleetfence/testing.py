"""Helpers that tests, benchmarks and the demo share (the bytewax `testing` module's idea).

Waiting is always "poll a condition until a deadline", never a sleep that hopes: `wait_for` is the
one implementation, so every wait in the suite fails the same way, naming what it waited for and
the last value it saw.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from fleetfence.errors import FleetFenceError

T = TypeVar("T")


class WaitTimeoutError(FleetFenceError, AssertionError):
    """A condition did not become true before its deadline (an AssertionError, so a test fails
    on it rather than erroring)."""


def wait_for(
    check: Callable[[], T],
    timeout_s: float,
    what: str,
    *,
    interval_s: float = 0.05,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """Call `check` until it returns something truthy and return that; at the deadline raise
    WaitTimeoutError naming `what` and the last value. Exceptions of the `ignore` types count as
    "not yet" (a server still starting), any other propagates at once."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while True:
        try:
            value = check()
        except ignore as exc:
            last = exc
        else:
            if value:
                return value
            last = value
        if time.monotonic() > deadline:
            raise WaitTimeoutError(f"timed out after {timeout_s}s waiting for {what} (last: {last!r})")
        time.sleep(interval_s)
