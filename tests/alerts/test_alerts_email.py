"""The e-mail receiver's sink against a real SMTP server (aiosmtpd, TLS, AUTH), no broker: its config,
the templates, storm batching, retries, and that a restart with the same store mails nothing twice.

The sink is driven through its `HoldingSink` contract as the runner drives it (`deliver`, then
`settle` with the clock); `settle(now)` with a `now` past the window closes it without waiting.
The runner, Kafka and dead letters: tests/alerts/test_alerts_receivers.py.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from cryptography.hazmat.primitives import serialization
from prometheus_client import CollectorRegistry

from alerts.config import EmailConfig, parse_config
from alerts.dedup import MemoryDedup
from alerts.email import IDS_HEADER, EmailSink, message_id, recipient_marker
from alerts.metrics import ReceiverMetrics
from alerts.model import Alert, SourceRecord, parse_alert
from alerts.sink import Context, HoldingSink, Outcome
from fleetfence.contracts import alert_id, ms_to_iso
from fleetfence.errors import ConfigError
from fleetfence.pki import make_ca
from tests.alerts.helpers import SMTP_PASSWORD, SMTP_USER, SmtpServer

LATER = 1e9  # a `now` past any window
# aiosmtpd tracks STARTTLS only and warns about AUTH on the implicit-TLS listener, which is TLS.
pytestmark = pytest.mark.filterwarnings("ignore:Requiring AUTH while not requiring TLS:UserWarning")


def email_toml(server: SmtpServer, ca: Path, extra: str = "", tls: str | None = None) -> str:
    return f"""
[[receivers]]
name = "ops-mail"
kind = "email"
host = "127.0.0.1"
port = {server.port}
tls = "{tls or server.mode}"
ca_file = "{ca}"
username = "{SMTP_USER}"
password_env = "FF_TEST_SMTP_PASSWORD"
sender = "FleetFence <alerts@fleet.example>"
recipients = ["ops@fleet.example", "dispatch@fleet.example"]
interval_s = 30
backoff_initial_ms = 10
backoff_max_ms = 20
timeout_s = 5
{extra}
"""


def config(server: SmtpServer, extra: str = "", tls: str | None = None) -> EmailConfig:
    cfg = parse_config(email_toml(server, server.tls_files.ca, extra, tls)).receivers[0]
    assert isinstance(cfg, EmailConfig)
    return cfg


def alert(vehicle: str, seq: int, kind: str = "ROUTE_DEVIATION", zone: str = "") -> Alert:
    d: dict[str, Any] = {
        "alert_id": alert_id(vehicle, kind, seq, zone),
        "type": kind,
        "vehicle_id": vehicle,
        "route_id": "r-berlin-1",
        "seq": seq,
        "ts_ms": 1_795_320_000_000 + seq * 1000,
        "lat": 52.52,
        "lon": 13.405,
        "details": {"zone_id": zone} if zone else {"distance_m": 212.4},
    }
    if zone:
        d["zone_id"] = zone
    return parse_alert(orjson.dumps(d))


def context(offset: int = 0, partition: int = 0) -> Context:
    return Context(
        SourceRecord("fleet.alerts", partition, offset, None),
        ReceiverMetrics("ops-mail", CollectorRegistry()),
        None,
        threading.Event(),
    )


@pytest.fixture(autouse=True)
def _password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FF_TEST_SMTP_PASSWORD", SMTP_PASSWORD)


def test_one_alert_one_mail_per_recipient_with_its_template(smtp_server: SmtpServer) -> None:
    cfg = config(
        smtp_server,
        """[receivers.subject]
route_deviation = "Off route: $vehicle_id on $route_id"
[receivers.body]
default = "$type of $vehicle_id at $time, $details ($alert_id)"
""",
    )
    sink = EmailSink(cfg, MemoryDedup())
    assert isinstance(sink, HoldingSink)
    a = alert("truck-042", 7)
    ctx = context(offset=41, partition=2)
    assert sink.deliver(a, ctx) is Outcome.HELD
    assert sink.held_from() == {("fleet.alerts", 2): 41}
    assert sink.settle(time.monotonic()) == []  # the window is still open
    settled = sink.settle(LATER)
    assert [(s.alert.alert_id, s.outcome) for s in settled] == [(a.alert_id, Outcome.DELIVERED)]
    assert sink.held_count() == 0
    assert sink.held_from() == {}
    got = smtp_server.snapshot()
    assert sorted(r.rcpt_tos[0] for r in got) == ["dispatch@fleet.example", "ops@fleet.example"]
    for r in got:
        assert r.tls
        assert r.login == SMTP_USER
        assert r.mail_from == "alerts@fleet.example"
        m = r.message
        assert m["Subject"] == "Off route: truck-042 on r-berlin-1"
        assert m["To"] == r.rcpt_tos[0]
        assert m["From"] == "FleetFence <alerts@fleet.example>"
        assert m["Message-ID"] == message_id("ops-mail", r.rcpt_tos[0], [a.alert_id], "fleet.example")
        assert m[IDS_HEADER] == a.alert_id
        body = m.get_content()
        assert (
            body == f"ROUTE_DEVIATION of truck-042 at {ms_to_iso(a.ts_ms)}, distance_m=212.4 ({a.alert_id})\n"
        )
    assert ctx.metrics.snapshot().messages == 2
    sink.close()


def test_a_storm_is_one_mail_per_recipient_listing_every_alert(smtps_server: SmtpServer) -> None:
    cfg = config(smtps_server)
    sink = EmailSink(cfg, MemoryDedup())
    storm = [
        alert(f"truck-{i % 7:03d}", 100 + i, "OVERSPEED" if i % 3 else "ZONE_ENTER", "depot")
        for i in range(40)
    ]
    for i, a in enumerate(storm):
        assert sink.deliver(a, context(offset=i, partition=i % 4)) is Outcome.HELD
    assert sink.deliver(storm[0], context(offset=99)) is Outcome.DUPLICATE  # already held
    assert sink.held_from() == {("fleet.alerts", p): p for p in range(4)}
    settled = sink.settle(LATER)
    assert len(settled) == 40
    assert {s.outcome for s in settled} == {Outcome.DELIVERED}
    got = smtps_server.snapshot()
    assert len(got) == 2  # one per recipient
    assert all(r.tls and r.login == SMTP_USER for r in got)
    for r in got:
        m = r.message
        assert m["Subject"] == "[FleetFence] 40 alerts: 26 OVERSPEED, 14 ZONE_ENTER"
        assert m["X-FleetFence-Alert-Count"] == "40"
        ids = [a.alert_id for a in storm]
        assert m[IDS_HEADER].split(", ") == ids
        body = m.get_content()
        assert body.startswith(
            f"40 alerts between {ms_to_iso(storm[0].ts_ms)} and {ms_to_iso(storm[-1].ts_ms)} (UTC)"
        )
        assert all(f"alert id: {i}" in body for i in ids)  # the default body, once per alert
        assert body.count("alert id: ") == 40
    # The next alert opens a new window: nothing before it closes.
    late = alert("truck-001", 500)
    assert sink.deliver(late, context(offset=50)) is Outcome.HELD
    assert sink.settle(time.monotonic()) == []
    assert len(smtps_server.snapshot()) == 2
    sink.close()


def test_a_4xx_is_retried_and_the_mail_accepted_once(smtp_server: SmtpServer) -> None:
    smtp_server.respond = lambda n: "451 4.3.0 try again later" if n <= 2 else "250 OK"
    cfg = config(smtp_server).model_copy(update={"recipients": ["ops@fleet.example"], "max_attempts": 4})
    sink = EmailSink(cfg, MemoryDedup())
    ctx = context()
    a = alert("truck-042", 8)
    sink.deliver(a, ctx)
    assert [s.outcome for s in sink.settle(LATER)] == [Outcome.DELIVERED]
    assert smtp_server.data_attempts == 3
    assert [r.message[IDS_HEADER] for r in smtp_server.snapshot()] == [a.alert_id]
    assert ctx.metrics.snapshot().retried == 2
    sink.close()


def test_a_restart_with_the_same_store_mails_nothing_twice_and_loses_nothing(smtp_server: SmtpServer) -> None:
    cfg = config(smtp_server)
    store = MemoryDedup()  # the receiver's Redis store, which outlives its process
    first = EmailSink(cfg, store)
    mailed = [alert("truck-042", n) for n in range(1, 4)]
    for n, a in enumerate(mailed):
        first.deliver(a, context(offset=n))
    assert len(first.settle(LATER)) == 3
    # The process dies before the runner recorded the alerts themselves (and before any offset
    # commit); a held alert it never mailed dies with it.
    unsent = alert("truck-042", 4)
    assert first.deliver(unsent, context(offset=3)) is Outcome.HELD
    first.close()
    assert len(smtp_server.snapshot()) == 2
    # The restarted receiver reads all four again from the last committed offset.
    second = EmailSink(cfg, store)
    outcomes = [second.deliver(a, context(offset=n)) for n, a in enumerate([*mailed, unsent])]
    assert outcomes == [Outcome.DUPLICATE] * 3 + [Outcome.HELD]
    assert [s.alert.alert_id for s in second.settle(LATER)] == [unsent.alert_id]
    got = smtp_server.snapshot()
    assert len(got) == 4
    assert sorted(r.message[IDS_HEADER] for r in got[2:]) == [unsent.alert_id] * 2
    # Half-done: one recipient had the alert when the process died, the other not yet.
    half = alert("truck-043", 9)
    store.mark(recipient_marker("ops@fleet.example", half.alert_id))
    third = EmailSink(cfg, store)
    third.deliver(half, context())
    third.settle(LATER)
    assert [r.rcpt_tos for r in smtp_server.snapshot()[4:]] == [["dispatch@fleet.example"]]
    for s in (second, third):
        s.close()


def test_released_partitions_are_dropped_and_the_window_with_them(smtp_server: SmtpServer) -> None:
    sink = EmailSink(config(smtp_server), MemoryDedup())
    sink.deliver(alert("truck-042", 1), context(offset=5, partition=0))
    sink.deliver(alert("truck-042", 2), context(offset=6, partition=1))
    assert sink.release([("fleet.alerts", 0)]) == 1
    assert sink.held_from() == {("fleet.alerts", 1): 6}
    assert sink.release([("fleet.alerts", 1)]) == 1
    assert sink.release([("fleet.alerts", 1)]) == 0
    assert sink.held_count() == 0
    assert sink.settle(LATER) == []
    assert smtp_server.snapshot() == []


def test_an_untrusted_server_certificate_is_not_sent_to(smtp_server: SmtpServer, tmp_path: Path) -> None:
    other_ca = tmp_path / "other.crt"
    other_ca.write_bytes(make_ca(1)[1].public_bytes(serialization.Encoding.PEM))
    cfg = config(smtp_server).model_copy(
        update={"ca_file": other_ca, "max_attempts": 1, "recipients": ["ops@fleet.example"]}
    )
    sink = EmailSink(cfg, MemoryDedup())
    attempt = sink.send_once("ops@fleet.example", sink.compose("ops@fleet.example", [alert("truck-042", 1)]))
    assert attempt.verdict == "transient"
    assert "CERTIFICATE_VERIFY_FAILED" in attempt.detail
    assert smtp_server.snapshot() == []
    assert smtp_server.auth_failures == 0  # the password never left
    sink.close()


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ('[receivers.subject]\ndefault = "$type at $plcae"\n', r"unknown placeholders \['plcae'\]"),
        ('[receivers.body]\nOVERSPEED = "costs $5"\n', "invalid template"),
        ('[receivers.body]\nSPEEDING = "$type"\n', "neither 'default' nor an alert type"),
        ('batch_subject = "$count alerts for $vehicle_id"\n', r"unknown placeholders \['vehicle_id'\]"),
        ('recipients = ["ops"]\n', "not an e-mail address"),
        ("max_attempts = 20\ntimeout_s = 30\n", "retry budget"),
        ("interval = 5\n", "Extra inputs are not permitted"),
    ],
)
def test_config_errors_are_found_at_load(smtp_server: SmtpServer, extra: str, match: str) -> None:
    keys = {line.split("=")[0].strip() for line in extra.splitlines() if "=" in line and "[" not in line[:1]}
    base = email_toml(smtp_server, smtp_server.tls_files.ca).splitlines()
    text = "\n".join(x for x in base if x.split("=")[0].strip() not in keys) + "\n" + extra
    with pytest.raises(ConfigError, match=match):
        parse_config(text)


def test_plaintext_only_to_this_host_and_without_a_password(
    smtp_server: SmtpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = email_toml(smtp_server, smtp_server.tls_files.ca, tls="none")
    with pytest.raises(ConfigError, match="sends no password"):
        parse_config(base)
    no_auth = "\n".join(x for x in base.splitlines() if not x.startswith(("username", "password_env")))
    assert parse_config(no_auth).receivers[0].kind == "email"
    with pytest.raises(ConfigError, match="only allowed to a relay on this host"):
        parse_config(no_auth.replace('host = "127.0.0.1"', 'host = "smtp.fleet.example"'))
    with pytest.raises(ConfigError, match=r"ca_file /nowhere/ca\.crt is not a file"):
        parse_config(email_toml(smtp_server, Path("/nowhere/ca.crt")))
    monkeypatch.delenv("FF_TEST_SMTP_PASSWORD")
    with pytest.raises(ConfigError, match="FF_TEST_SMTP_PASSWORD"):
        parse_config(email_toml(smtp_server, smtp_server.tls_files.ca))


def test_a_refused_login_and_a_5xx_are_permanent(
    smtp_server: SmtpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the runner then dead-letters at once, without retrying (the dead letters themselves:
    tests/alerts/test_alerts_receivers.py)."""
    monkeypatch.setenv("FF_TEST_SMTP_PASSWORD", "not-the-password")
    a = alert("truck-042", 1)
    wrong = EmailSink(config(smtp_server), MemoryDedup())
    attempt = wrong.send_once("ops@fleet.example", wrong.compose("ops@fleet.example", [a]))
    assert (attempt.verdict, attempt.code) == ("permanent", 535)
    assert "SMTPAuthenticationError" in attempt.detail
    assert smtp_server.auth_failures == 1
    wrong.close()
    monkeypatch.setenv("FF_TEST_SMTP_PASSWORD", SMTP_PASSWORD)
    smtp_server.respond = lambda _n: "550 5.1.1 mailbox unavailable"
    right = EmailSink(config(smtp_server), MemoryDedup())
    attempt = right.send_once("ops@fleet.example", right.compose("ops@fleet.example", [a]))
    assert (attempt.verdict, attempt.code) == ("permanent", 550)
    assert "mailbox unavailable" in attempt.detail
    assert smtp_server.data_attempts == 1
    assert smtp_server.snapshot() == []
    right.close()
