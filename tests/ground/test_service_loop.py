"""The one service run loop (fleetfence.service): signals set the stop event, the loop sees it."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from fleetfence.service import run_until_stopped, stop_on_signals


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_loop_and_the_old_handler_comes_back(sig: signal.Signals) -> None:
    before = signal.getsignal(sig)
    steps = 0

    def step() -> bool:
        nonlocal steps
        steps += 1
        if steps == 3:
            os.kill(os.getpid(), sig)  # delivered to the main thread before the next check
        return False

    with stop_on_signals() as stop:
        assert run_until_stopped(step, stop) is False
        assert stop.is_set()
    assert steps == 3
    assert signal.getsignal(sig) is before


def test_the_loop_returns_true_when_the_work_ends_on_its_own() -> None:
    ticks = iter([False, False, True])
    with stop_on_signals() as stop:
        assert run_until_stopped(lambda: next(ticks), stop) is True
        assert not stop.is_set()


def test_off_the_main_thread_only_the_callers_event_stops_it() -> None:
    caller = threading.Event()
    seen: list[object] = []

    def body() -> None:
        with stop_on_signals(caller) as stop:
            seen.append(stop)
            seen.append(signal.getsignal(signal.SIGTERM))
            caller.set()
            seen.append(run_until_stopped(lambda: False, stop))

    t = threading.Thread(target=body)
    t.start()
    t.join(10)
    assert seen[0] is caller
    assert seen[1] is signal.getsignal(signal.SIGTERM)  # nothing installed from a thread
    assert seen[2] is False
