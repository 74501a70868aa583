"""The load test's settle waits longer than the processor's batches take now (run 21 of the
deployment suite settled 3 s before a 90 s batch emitted the alerts of the fixes it had just read)."""

from __future__ import annotations

from loadtest.taps import MarkerTotals


def marker(sink: str, at_ms: int, received: int = 0) -> dict[str, object]:
    return {"sink_id": sink, "batch_id": at_ms, "committed_ms": at_ms, "received": received}


def test_pace_is_the_longest_of_the_last_three_intervals_of_a_sink() -> None:
    t = MarkerTotals()
    assert t.batch_pace_s == 0
    for at in (0, 1_000, 2_000, 92_000, 93_000, 94_000):
        t.add(marker("job", at, received=10))
    assert t.batch_pace_s == 90.0  # 92 s -> 93 -> 94: the 90 s batch is still among the last three
    t.add(marker("job", 95_000))
    assert t.batch_pace_s == 1.0
    assert t.batches == 7
    assert t.received == 60


def test_two_sinks_interleaved_keep_their_own_pace() -> None:
    """The proximity query's markers share the topic: interleaved, they must not halve the job's."""
    t = MarkerTotals()
    for at in (0, 30_000, 60_000):
        t.add(marker("job", at))
        t.add(marker("proximity", at + 500))
    assert t.batch_pace_s == 30.0


def test_a_marker_read_twice_counts_once() -> None:
    """Deployment run 23's two-of-three row: the processor read what the gateways forwarded, but
    the load test's totals did not reconcile; a marker handed over again must not count twice."""
    t = MarkerTotals()
    t.add(marker("job", 1_000, received=10))
    t.add(marker("job", 2_000, received=5))
    t.add(marker("job", 1_000, received=10))  # the same batch's marker again
    t.add(marker("proximity", 1_000, received=0))  # another sink's batch 1000: its own
    assert t.batches == 3
    assert t.received == 15
