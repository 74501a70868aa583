"""The one run loop of a long-running FleetFence service: run until a signal, then stop cleanly.

Every service (the gateway, the processor, the archive, the receivers, the outbox relay) is the
same shape: install SIGTERM/SIGINT handlers that only set an event, then poll a step that itself
waits a bounded time for something to happen, until the step says the work ended on its own or the
event is set; then the caller stops in its own way (drain, finish the micro-batch, close sinks).
Handlers only set an event because almost nothing is safe inside a signal handler, and the poll has
a bound so a stop is seen within it, without a busy loop.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

logger = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextmanager
def stop_on_signals(stop: threading.Event | None = None) -> Iterator[threading.Event]:
    """An event that SIGTERM and SIGINT set, with the previous handlers restored on exit.

    Off the main thread (a service embedded in a test or in the demo) no handler can be installed;
    the caller's own event is the only way to stop it then.
    """
    event = stop or threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield event
        return

    def handler(signum: int, _frame: FrameType | None) -> None:
        logger.info("signal received, stopping signal=%s", signal.Signals(signum).name)
        event.set()

    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield event
    finally:
        for sig, h in previous.items():
            signal.signal(sig, h)


def run_until_stopped(step: Callable[[], bool], stop: threading.Event) -> bool:
    """Call `step` until it returns True (the work ended on its own: True is returned) or `stop` is
    set (False). `step` must wait up to a bounded time itself (e.g. `awaitTermination(0.5)`)."""
    while not stop.is_set():
        if step():
            return True
    return False


def stop_process_group(proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    """Stop a service started in its own session (`start_new_session=True`) the way its run loop
    expects: SIGTERM to the whole group (the service and its children, e.g. Spark's JVM), a wait
    for it to finish its work, and SIGKILL only when it overruns `timeout_s`."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        logger.warning("process group ignored SIGTERM, killing pid=%s", proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
