"""The load test's reconciliation of the gateways' receipts with the broker's acknowledgements,
when a restarted Mosquitto redelivers (tests_deploy's Mosquitto SIGKILL: its persistence file
restores each gateway's session as of the last autosave, and what was in flight then comes again)."""

from __future__ import annotations

from loadtest.driver import received_every_acked


def test_every_acknowledged_fix_received_once_or_redelivered() -> None:
    assert received_every_acked(acked=8702, received=8702, redelivered=0)
    # Run 20: 21 messages in flight at the broker's last autosave, acknowledged since, sent again.
    assert received_every_acked(acked=8702, received=8723, redelivered=21)
    assert received_every_acked(acked=8702, received=8710, redelivered=21)  # some were first receipts


def test_a_missing_fix_or_an_unexplained_extra_fails() -> None:
    assert not received_every_acked(acked=8702, received=8701, redelivered=21)
    assert not received_every_acked(acked=8702, received=8724, redelivered=21)
    assert not received_every_acked(acked=8702, received=8703, redelivered=0)
