"""Pure alert logic: the contract parser, filters, open conditions, config, signing, back-off."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import orjson
import pytest

from alerts.config import EmailConfig, HistoryConfig, WebhookConfig, load_config, parse_config
from alerts.errors import UnmappedAlertTypeError
from alerts.model import AlertFilter, condition_change, parse_alert, summary
from alerts.tail import render
from alerts.webhook import backoff_ms, sign, verify_signature
from fleetfence.contracts import AlertType, alert_id
from fleetfence.errors import ConfigError, ContractError

REPO = Path(__file__).resolve().parents[2]


def alert_dict(
    vehicle: str = "truck-042", kind: str = "ROUTE_DEVIATION", seq: int = 1817, **kw: Any
) -> dict[str, Any]:
    d: dict[str, Any] = {
        "alert_id": alert_id(vehicle, kind, seq, kw.get("zone_id", "")),
        "type": kind,
        "vehicle_id": vehicle,
        "route_id": "r-berlin-1",
        "route_version": 3,
        "seq": seq,
        "ts_ms": 1795320930250,
        "ts": "2026-11-22T08:15:30.250Z",
        "lat": 52.5201,
        "lon": 13.4049,
        "details": {"distance_m": 212.4, "outside_fixes": 3, "outside_s": 2.0},
    }
    d.update(kw)
    return d


def test_contract_example_parses_and_keeps_raw_bytes() -> None:
    raw = orjson.dumps(alert_dict())
    a = parse_alert(raw)
    assert a.raw is raw
    assert a.type is AlertType.ROUTE_DEVIATION
    assert (a.vehicle_id, a.route_id, a.seq, a.ts_ms) == ("truck-042", "r-berlin-1", 1817, 1795320930250)
    # The line shows ts_ms in UTC (the contract example's `ts` string does not match its ts_ms).
    assert summary(a).startswith("2026-11-22T04:15:30.250Z ROUTE_DEVIATION")
    assert "distance_m=212.4" in summary(a)
    assert render(a).plain == summary(a)


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (None, "no value"),
        (b"not json", "not JSON"),
        (b"[1]", "JSON object"),
        (orjson.dumps(alert_dict(alert_id="")), "alert_id"),
        (orjson.dumps(alert_dict(type="PANIC")), "'type'"),
        (orjson.dumps(alert_dict(vehicle_id="bad id/with slash")), "vehicle_id"),
        (orjson.dumps({**alert_dict(), "seq": "7"}), "'seq' must be an integer"),
        (orjson.dumps({k: v for k, v in alert_dict().items() if k != "ts_ms"}), "'ts_ms' is required"),
        (orjson.dumps(alert_dict(lat="north")), "'lat'"),
        (orjson.dumps(alert_dict(kind="ZONE_ENTER")), "zone_id"),
        (b"{" + b" " * 70_000 + b"}", "exceeds"),
    ],
)
def test_invalid_alerts_get_a_clear_reason(raw: bytes | None, match: str) -> None:
    with pytest.raises(ContractError, match=match) as info:
        parse_alert(raw)
    assert info.value.reason == "invalid_alert"


def test_filter_is_or_within_and_across_dimensions() -> None:
    dev = parse_alert(orjson.dumps(alert_dict()))
    speed = parse_alert(orjson.dumps(alert_dict(kind="OVERSPEED", route_id="r-2")))
    no_route = parse_alert(orjson.dumps(alert_dict(kind="VEHICLE_SILENT", route_id=None)))
    only_dev_on_r1 = AlertFilter.of(["route_deviation"], [], ["r-berlin-1"])
    assert only_dev_on_r1.matches(dev)
    assert not only_dev_on_r1.matches(speed)
    assert not AlertFilter.of([], [], ["r-berlin-1"]).matches(no_route)
    either = AlertFilter.of(["ROUTE_DEVIATION", "OVERSPEED"], ["truck-042"])
    assert either.matches(dev)
    assert either.matches(speed)
    assert not AlertFilter.of([], ["other"]).matches(dev)
    assert AlertFilter().matches(no_route)
    assert AlertFilter().describe() == "all alerts"
    with pytest.raises(ContractError, match="alert types are"):
        AlertFilter.of(["SPEEDING"])


# What each alert type does to the vehicle's open conditions (docs/alerts.md, "Open conditions"):
# (opens, closes). One row per AlertType, so a new type fails here until its rule is written.
TRIP_OPENS = ("WRONG_DIRECTION", "UNPLANNED_STOP", "ARRIVAL_AT_RISK")
CONDITIONS: dict[AlertType, tuple[str | None, tuple[str, ...]]] = {
    AlertType.ROUTE_DEVIATION: ("ROUTE_DEVIATION", ("VEHICLE_SILENT",)),
    AlertType.ROUTE_RETURN: (None, ("ROUTE_DEVIATION", "VEHICLE_SILENT")),
    AlertType.OVERSPEED: ("OVERSPEED", ("VEHICLE_SILENT",)),
    AlertType.ZONE_ENTER: ("ZONE:depot-1", ("VEHICLE_SILENT",)),
    AlertType.ZONE_EXIT: (None, ("ZONE:depot-1", "VEHICLE_SILENT")),
    AlertType.VEHICLE_SILENT: ("VEHICLE_SILENT", ()),
    AlertType.VEHICLE_RESUMED: (None, ("VEHICLE_SILENT",)),
    # The trip's conditions; completing the route ends whichever is still open.
    AlertType.WRONG_DIRECTION: ("WRONG_DIRECTION", ("VEHICLE_SILENT",)),
    AlertType.DIRECTION_RESTORED: (None, ("WRONG_DIRECTION", "VEHICLE_SILENT")),
    AlertType.UNPLANNED_STOP: ("UNPLANNED_STOP", ("VEHICLE_SILENT",)),
    AlertType.STOP_ENDED: (None, ("UNPLANNED_STOP", "VEHICLE_SILENT")),
    AlertType.ARRIVAL_AT_RISK: ("ARRIVAL_AT_RISK", ("VEHICLE_SILENT",)),
    AlertType.ARRIVAL_BACK_ON_TIME: (None, ("ARRIVAL_AT_RISK", "VEHICLE_SILENT")),
    AlertType.ROUTE_COMPLETED: (None, (*TRIP_OPENS, "VEHICLE_SILENT")),
    # Proximity: per other vehicle (an exit by loss closes its own only: test_processor_proximity).
    AlertType.PROXIMITY_ENTER: ("PROXIMITY:convoy:truck-007", ("VEHICLE_SILENT",)),
    AlertType.PROXIMITY_EXIT: (None, ("PROXIMITY:convoy:truck-007", "PROXIMITY:truck-007", "VEHICLE_SILENT")),
}


@pytest.mark.parametrize("kind", list(AlertType), ids=str)
def test_every_alert_type_has_its_open_condition_rule(kind: AlertType) -> None:
    """Iterates the contract's types, not the table: a type added to fleetfence.contracts without
    its expected rule here fails this test, whatever its `AlertMeta` makes condition_change do."""
    assert kind in CONDITIONS, f"{kind.value}: no expected open-condition rule in this test"
    # Zone alerts carry their zone at the top level or in details; both are read. Pair alerts name
    # the other vehicle in details.
    other = {"other_vehicle_id": "truck-007", "rule_id": "convoy"}
    for where in (
        {"zone_id": "depot-1", "details": other},
        {"details": {"zone_id": "depot-1", "dwell_s": 30, **other}},
    ):
        c = condition_change(parse_alert(orjson.dumps(alert_dict(kind=kind.value, **where))))
        assert (c.opens, c.closes) == CONDITIONS[kind]


def test_a_pair_alert_without_the_other_vehicle_is_refused() -> None:
    with pytest.raises(ContractError, match="other_vehicle_id"):
        parse_alert(orjson.dumps(alert_dict(kind="PROXIMITY_ENTER", details={"distance_m": 20})))
    # Without its rule (an alert from before pair alerts named one): keyed by the other vehicle alone.
    bare = alert_dict(kind="PROXIMITY_ENTER", details={"other_vehicle_id": "truck-007"})
    assert condition_change(parse_alert(orjson.dumps(bare))).opens == "PROXIMITY:truck-007"


def test_an_unmapped_alert_type_is_an_error_not_a_zone_exit() -> None:
    """An alert whose type has no rule (only reachable past mypy) raises instead of closing a
    made-up `ZONE:` condition, as a type falling through to the zone rules once did."""
    alert = parse_alert(orjson.dumps(alert_dict(kind="ZONE_EXIT", zone_id="depot-1")))
    with pytest.raises(UnmappedAlertTypeError, match="'ZONE_DWELL' has no open-condition rule"):
        condition_change(replace(alert, type=cast(AlertType, "ZONE_DWELL")))


def test_an_alert_type_cannot_be_declared_without_its_meta() -> None:
    """What `AlertType`'s class body runs for each member: one declared as a bare string (no label,
    no open-condition rule) is a TypeError at import, not a type every receiver guesses about."""
    declare = AlertType._new_member_  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="HARSH_BRAKING is declared without its AlertMeta"):
        declare(AlertType, "HARSH_BRAKING")
    assert declare(AlertType, "X", AlertType.OVERSPEED.meta).meta.label == "Speeding"


def test_signature_matches_and_detects_tampering() -> None:
    body = orjson.dumps(alert_dict())
    header = sign(b"s3cret", body)
    assert header.startswith("sha256=")
    assert len(header) == len("sha256=") + 64
    assert verify_signature(b"s3cret", body, header)
    assert not verify_signature(b"s3cret", body + b" ", header)
    assert not verify_signature(b"other", body, header)
    assert not verify_signature(b"s3cret", body, None)


def test_backoff_is_exponential_capped_and_jittered() -> None:
    rng = random.Random(7)
    delays = [backoff_ms(n, 100, 1000, rng) for n in range(1, 8)]
    for n, d in enumerate(delays, start=1):
        base = min(1000, 100 * 2 ** (n - 1))
        assert 0.8 * base <= d <= min(1000, 1.2 * base)
    assert max(delays) <= 1000
    assert delays[0] < delays[2] < delays[4]


def test_example_config_is_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISPATCH_WEBHOOK_SECRET", "x")
    monkeypatch.setenv("OPS_SMTP_PASSWORD", "x")
    cfg = load_config(REPO / "docs" / "receivers.example.toml")
    kinds = {r.name: r.kind for r in cfg.receivers}
    assert set(kinds.values()) == {"history", "mqtt", "webhook", "email"}
    hook = next(r for r in cfg.enabled if isinstance(r, WebhookConfig))
    assert hook.filter.build().types == {AlertType.ROUTE_DEVIATION}
    mail = next(r for r in cfg.enabled if isinstance(r, EmailConfig))
    assert (mail.smtp_port, mail.tls, mail.interval_s) == (587, "starttls", 60)
    assert set(mail.subject) == {"default", "VEHICLE_SILENT"}


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("receivers = [", "not valid TOML"),
        ("", "receivers"),
        ('[[receivers]]\nname = "h"\nkind = "fax"', "kind"),
        ('[[receivers]]\nname = "h"\nkind = "history"\nfiltr = {}', "filtr"),
        ('[[receivers]]\nname = "h"\nkind = "history"\nfilter = {types = ["SPEEDING"]}', "SPEEDING"),
        (
            '[[receivers]]\nname = "h"\nkind = "history"\n[[receivers]]\nname = "h"\nkind = "history"',
            "unique",
        ),
        ('[[receivers]]\nname = "Bad Name"\nkind = "history"', "receiver name"),
        ('[[receivers]]\nname = "w"\nkind = "webhook"\nurl = "ftp://x"\nsecret = "s"', "http"),
        ('[[receivers]]\nname = "w"\nkind = "webhook"\nurl = "http://x"', "secret_env"),
        (
            '[[receivers]]\nname = "w"\nkind = "webhook"\nurl = "http://x"\n'
            'secret_env = "FF_TEST_UNSET_SECRET"',
            "FF_TEST_UNSET_SECRET",
        ),
        (
            '[[receivers]]\nname = "w"\nkind = "webhook"\nurl = "http://x"\nsecret = "s"\n'
            "max_attempts = 20\nbackoff_max_ms = 60000",
            "retry budget",
        ),
        ('[[receivers]]\nname = "m"\nkind = "mqtt"\nvehicle_topic = "fleet/alerts"', "vehicle_id"),
    ],
)
def test_bad_config_is_a_clear_error(text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_config(text, "receivers.toml")


def test_missing_config_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read receivers config"):
        load_config(tmp_path / "nope.toml")


def test_each_registry_sees_its_own_receiver_metrics_even_at_a_reused_address() -> None:
    # Registries made and dropped in a loop reuse each other's addresses in CPython: families
    # cached by id() would hand a new registry the dead one's, and its samples would be missing.
    from prometheus_client import CollectorRegistry

    from alerts.metrics import ReceiverMetrics

    addresses = set()
    for _ in range(50):
        registry = CollectorRegistry()
        addresses.add(id(registry))
        ReceiverMetrics("mqtt", registry).delivered()
        assert (
            registry.get_sample_value("fleetfence_alert_receiver_delivered_total", {"receiver": "mqtt"}) == 1
        )
        del registry
    assert len(addresses) < 50, "the loop must reuse an address to test anything"


def test_the_alert_history_is_bounded_unless_told_otherwise() -> None:
    """A history receiver configured without `retention_days` keeps 30 days, not every alert for
    ever (issue #64: a default installation's Redis grew by ~1 KiB an alert without bound)."""
    default = parse_config('[[receivers]]\nname = "history"\nkind = "history"\n').enabled[0]
    assert isinstance(default, HistoryConfig)
    assert default.retention_days == 30.0
    week = parse_config('[[receivers]]\nname = "h"\nkind = "history"\nretention_days = 7\n').enabled[0]
    assert isinstance(week, HistoryConfig)
    assert week.retention_days == 7.0
    with pytest.raises(ConfigError):
        parse_config('[[receivers]]\nname = "h"\nkind = "history"\nretention_days = 0\n')
