"""The load test's counting, which must survive the faults it measures: which of the run's fixes
Kafka holds (once each, however often a device sent them again after a lost PUBACK), and the
gateways' own counts across a replica's restart (its counters back at zero)."""

from __future__ import annotations

from loadtest.taps import MAX_SPAN, SPAN_MARGIN, FixLedger, ReplicaCounts


def test_the_ledger_counts_each_fix_of_the_run_once() -> None:
    ledger = FixLedger("lt1s0-")
    assert ledger.mine("lt1s0-v7")
    assert not ledger.mine("truck-1")
    first = 1_765_115_000  # the simulator's seqs: the run's epoch time over the fix period
    assert ledger.add("lt1s0-v7", first)
    assert ledger.add("lt1s0-v7", first + 1)
    assert not ledger.add("lt1s0-v7", first + 1)  # sent again: not a new fix
    assert ledger.add("lt1s0-v8", first + 1)  # another vehicle's seq is its own
    assert ledger.add("lt1s0-v7", first + 50_000)  # far past the bitmap's first size
    assert not ledger.add("lt1s0-v7", first + 50_000)
    assert ledger.add("lt1s0-v7", first - 10_000)  # out of order, before the first: it grows down
    assert not ledger.add("lt1s0-v7", first - 10_000)
    assert not ledger.add("lt1s0-v7", first)  # still known after growing down
    assert ledger.add("lt1s0-v7", first + MAX_SPAN + 1)  # absurdly far: kept in a set
    assert not ledger.add("lt1s0-v7", first + MAX_SPAN + 1)
    assert ledger.distinct == 6


def test_a_soaks_ledger_costs_about_a_byte_a_fix() -> None:
    """2 h at 1 Hz for 50 vehicles with epoch-sized seqs: a bitmap per vehicle, not a set of tuples."""
    ledger = FixLedger("lt2s0-")
    base = 1_765_115_000
    for v in range(50):
        for k in range(7_200):
            ledger.add(f"lt2s0-v{v}", base + k)
    assert ledger.distinct == 50 * 7_200
    assert ledger.bitmap_bytes <= 50 * (7_200 + 2 * SPAN_MARGIN) * 2


def test_a_restarted_replica_keeps_what_its_earlier_life_counted() -> None:
    # Present when the run started, having counted 100 (an attached installation's traffic).
    rep = ReplicaCounts(1000.0, (100.0, 100.0, 0.0, 0.0), (100.0, 100.0, 0.0, 0.0))
    assert not rep.seen(1000.0, (400.0, 390.0, 10.0, 0.0))
    assert rep.run_counts() == (300.0, 290.0, 10.0, 0.0)
    # SIGKILLed and started again; its new counters passed the old ones before the next reading:
    # only the start time tells the two lives apart.
    assert rep.seen(1060.0, (450.0, 440.0, 0.0, 3.0))
    assert rep.run_counts() == (750.0, 730.0, 10.0, 3.0)
    assert not rep.seen(1060.0, (500.0, 500.0, 0.0, 3.0))
    assert rep.run_counts() == (800.0, 790.0, 10.0, 3.0)
