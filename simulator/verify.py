"""`fleetfence verify`: the processor's committed alerts against a simulator ground truth.

`compare` is pure (hand-made inputs in, exact figures out); `read_alerts` is the Kafka adapter
(read_committed, from the beginning, until caught up and optionally until every expected alert is
there or a timeout passes). Matching is exact on (vehicle_id, type, zone_id, seq) by default;
`seq_tolerance` lets a near miss (same vehicle, type and zone, seq within the tolerance) match.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import orjson
from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition
from rich.table import Table

from fleetfence.console import compact_table, two_lines
from fleetfence.contracts import ms_to_iso
from fleetfence.kafka import group_consumer
from fleetfence.settings import Settings
from simulator.truth import RunHeader, TruthAlert

logger = logging.getLogger(__name__)

Key = tuple[str, str, str, int]


@dataclass(frozen=True, slots=True)
class ObservedAlert:
    alert_id: str
    vehicle_id: str
    type: str
    zone_id: str | None
    seq: int
    ts_ms: int
    record_ts_ms: int | None = None  # the Kafka record timestamp (when the processor produced it)
    lat: float | None = None
    lon: float | None = None
    other_vehicle_id: str | None = None  # a pair's alert: the other vehicle, in the zone's place
    rule_id: str | None = None  # a pair's alert: its proximity rule (a pair may meet under several)

    @property
    def key(self) -> Key:
        """A pair's alert is keyed by its rule and the other vehicle, in the zone's place."""
        pair = f"{self.rule_id or ''}:{self.other_vehicle_id}" if self.other_vehicle_id else ""
        return (self.vehicle_id, self.type, self.zone_id or pair, self.seq)

    @staticmethod
    def from_record(value: bytes, record_ts_ms: int | None) -> ObservedAlert:
        return ObservedAlert.from_dict(orjson.loads(value), record_ts_ms)

    @staticmethod
    def from_dict(d: dict[str, Any], record_ts_ms: int | None) -> ObservedAlert:
        """An alert already decoded (a load test keeps them decoded while it runs)."""
        details = d.get("details")
        other = details.get("other_vehicle_id") if isinstance(details, dict) else None
        rule = details.get("rule_id") if isinstance(details, dict) else None
        return ObservedAlert(
            str(d["alert_id"]),
            str(d["vehicle_id"]),
            str(d["type"]),
            d.get("zone_id"),
            int(d["seq"]),
            int(d["ts_ms"]),
            record_ts_ms,
            d.get("lat"),
            d.get("lon"),
            other if isinstance(other, str) else None,
            rule if isinstance(rule, str) else None,
        )


@dataclass
class Score:
    expected: int = 0
    observed: int = 0  # distinct alerts (by key)
    matched: int = 0
    duplicates: int = 0  # records beyond the first per alert_id or per key
    delays_ms: list[int] = field(default_factory=list)

    @property
    def precision(self) -> float | None:
        return self.matched / self.observed if self.observed else None

    @property
    def recall(self) -> float | None:
        return self.matched / self.expected if self.expected else None

    def delay(self, q: float) -> float | None:
        return float(np.percentile(self.delays_ms, q)) if self.delays_ms else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "expected": self.expected,
            "observed": self.observed,
            "matched": self.matched,
            "precision": self.precision,
            "recall": self.recall,
            "duplicates": self.duplicates,
            "delay_p50_ms": self.delay(50),
            "delay_p99_ms": self.delay(99),
            "delay_samples": len(self.delays_ms),
        }


MismatchKind = Literal["moved", "missing", "extra"]


@dataclass(frozen=True, slots=True)
class Mismatch:
    """One alert the truth and the processor disagree on: raised at another fix (`moved`: same
    vehicle, type and zone), never raised (`missing`), or raised though not expected (`extra`)."""

    kind: MismatchKind
    vehicle_id: str
    type: str
    zone_id: str | None
    expected: TruthAlert | None
    observed: ObservedAlert | None

    def to_dict(self) -> dict[str, Any]:
        def fix(a: TruthAlert | ObservedAlert | None) -> dict[str, Any] | None:
            if a is None:
                return None
            return {"seq": a.seq, "ts": ms_to_iso(a.ts_ms), "ts_ms": a.ts_ms, "lat": a.lat, "lon": a.lon}

        return {
            "kind": self.kind,
            "vehicle_id": self.vehicle_id,
            "type": self.type,
            "zone_id": self.zone_id,
            "expected": fix(self.expected),
            "observed": fix(self.observed),
        }


def mismatches(missing: list[TruthAlert], unexpected: list[ObservedAlert]) -> list[Mismatch]:
    """The disagreements, a missing and an unexpected alert of the same vehicle, type and zone (or
    other vehicle) paired (in seq order) as one alert raised at another fix; ordered by vehicle, type, seq."""
    exp: dict[tuple[str, str, str], list[TruthAlert]] = defaultdict(list)
    got: dict[tuple[str, str, str], list[ObservedAlert]] = defaultdict(list)
    for a in missing:
        exp[a.key[:3]].append(a)
    for o in unexpected:
        got[o.key[:3]].append(o)
    out: list[Mismatch] = []
    for key in sorted(exp.keys() | got.keys()):
        es = sorted(exp.get(key, []), key=lambda a: a.seq)
        gs = sorted(got.get(key, []), key=lambda o: o.seq)
        zone = key[2] or None
        for i in range(max(len(es), len(gs))):
            e = es[i] if i < len(es) else None
            g = gs[i] if i < len(gs) else None
            kind: MismatchKind = (
                "moved" if e is not None and g is not None else "missing" if g is None else "extra"
            )
            out.append(Mismatch(kind, key[0], key[1], zone, e, g))
    return out


# How many mismatches a report lists one by one; the rest are counted.
MISMATCH_CAP = 50


@dataclass
class VerifyResult:
    by_type: dict[str, Score]
    overall: Score
    duplicate_ids: int
    duplicate_keys: int
    missing: list[TruthAlert]
    unexpected: list[ObservedAlert]

    @property
    def mismatches(self) -> list[Mismatch]:
        return mismatches(self.missing, self.unexpected)

    def failures(self, min_precision: float, min_recall: float, max_duplicates: int) -> list[str]:
        """Why the run fails the gate (empty: it passes). An undefined ratio (0/0) passes."""
        out = []
        p, r = self.overall.precision, self.overall.recall
        if p is not None and p < min_precision:
            out.append(f"precision {p:.4f} < {min_precision}")
        if r is not None and r < min_recall:
            out.append(f"recall {r:.4f} < {min_recall}")
        if self.overall.duplicates > max_duplicates:
            out.append(f"duplicates {self.overall.duplicates} > {max_duplicates}")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "overall": self.overall.to_dict(),
            "by_type": {t: s.to_dict() for t, s in sorted(self.by_type.items())},
            "duplicate_ids": self.duplicate_ids,
            "duplicate_keys": self.duplicate_keys,
            "mismatch_count": len(found := self.mismatches),
            "mismatches": [m.to_dict() for m in found[:MISMATCH_CAP]],
        }


def in_scope(header: RunHeader, alerts: Iterable[ObservedAlert]) -> list[ObservedAlert]:
    """Only this run's vehicles and event-time span (other runs may share the topic), less the
    alerts its truth could not decide (`Scenario.undecided_alert_ids`)."""
    ids = header.vehicle_ids()
    undecided = set(header.assumptions.get("undecided_alert_ids") or ())
    return [
        a
        for a in alerts
        if a.vehicle_id in ids and header.start_ms <= a.ts_ms <= header.end_ms and a.alert_id not in undecided
    ]


def compare(
    truth: list[TruthAlert], observed: list[ObservedAlert], *, seq_tolerance: int = 0
) -> VerifyResult:
    """Precision, recall, duplicates and detection delay, per alert type and overall."""
    ids = Counter(a.alert_id for a in observed)
    keys = Counter(a.key for a in observed)
    dup_ids = sum(c - 1 for c in ids.values())
    dup_keys = sum(c - 1 for c in keys.values())
    first: dict[Key, ObservedAlert] = {}
    for o in observed:
        cur = first.get(o.key)
        if cur is None or (o.record_ts_ms or 0) < (cur.record_ts_ms or 0):
            first[o.key] = o
    by_type: dict[str, Score] = defaultdict(Score)
    for a in truth:
        by_type[a.type].expected += 1
    for k, o in first.items():
        by_type[o.type].observed += 1
        by_type[o.type].duplicates += keys[k] - 1
    by_type_dup_ids: Counter[str] = Counter()
    seen: set[str] = set()
    for o in observed:  # a repeated alert_id whose key differs (cannot happen unless ids collide)
        if o.alert_id in seen and keys[o.key] == 1:
            by_type_dup_ids[o.type] += 1
        seen.add(o.alert_id)
    for t, c in by_type_dup_ids.items():
        by_type[t].duplicates += c

    unmatched_obs = dict(first)
    missing: list[TruthAlert] = []
    pairs: list[tuple[TruthAlert, ObservedAlert]] = []
    near: list[TruthAlert] = []
    for a in truth:
        hit = unmatched_obs.pop(a.key, None)
        if hit is not None:
            pairs.append((a, hit))
        else:
            near.append(a)
    if seq_tolerance > 0 and near:
        pool: dict[tuple[str, str, str], list[ObservedAlert]] = defaultdict(list)
        for u in unmatched_obs.values():
            pool[u.key[:3]].append(u)
        for a in near:
            cands = [o for o in pool.get(a.key[:3], []) if abs(o.seq - a.seq) <= seq_tolerance]
            if cands:
                best = min(cands, key=lambda c: abs(c.seq - a.seq))
                pool[best.key[:3]].remove(best)
                unmatched_obs.pop(best.key)
                pairs.append((a, best))
            else:
                missing.append(a)
    else:
        missing = near
    for a, got in pairs:
        sc = by_type[a.type]
        sc.matched += 1
        if a.publish_ms is not None and got.record_ts_ms is not None:
            sc.delays_ms.append(got.record_ts_ms - a.publish_ms)
    overall = Score()
    for s in by_type.values():
        overall.expected += s.expected
        overall.observed += s.observed
        overall.matched += s.matched
        overall.duplicates += s.duplicates
        overall.delays_ms.extend(s.delays_ms)
    return VerifyResult(dict(by_type), overall, dup_ids, dup_keys, missing, list(unmatched_obs.values()))


def read_alerts(
    settings: Settings,
    *,
    timeout_s: float = 0.0,
    expected: set[Key] | None = None,
    caught_up_timeout_s: float = 60.0,
) -> list[ObservedAlert]:
    """Committed alerts from the start of `fleet.alerts` until caught up with every partition;
    then, with `timeout_s`, keep reading until all `expected` keys are there or time runs out."""
    topic = settings.topics.alerts
    c = group_consumer(
        settings.bootstrap_servers,
        f"fleetfence-verify-{uuid.uuid4().hex[:8]}",
        **{"enable.partition.eof": True},
    )
    out: list[ObservedAlert] = []
    try:
        md = c.list_topics(topic, timeout=10).topics.get(topic)
        if md is None or md.error is not None or not md.partitions:
            from fleetfence.errors import InfraError

            raise InfraError(f"topic {topic} does not exist on {settings.bootstrap_servers}")
        parts = sorted(md.partitions)
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        at_end: set[int] = set()
        seen: set[Key] = set()
        start = time.monotonic()
        caught_up = False
        while True:
            msgs = c.consume(1000, 0.2)
            for m in msgs:
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        at_end.add(m.partition())
                        continue
                    logger.warning("alert read error=%s", err)
                    continue
                at_end.discard(m.partition())
                ts_type, ts = m.timestamp()
                a = ObservedAlert.from_record(m.value(), ts if ts_type != 0 else None)
                out.append(a)
                seen.add(a.key)
            now = time.monotonic()
            if not caught_up:
                caught_up = len(at_end) == len(parts)
                if not caught_up and now - start > caught_up_timeout_s:
                    logger.warning(
                        "not caught up with %s after %ss; comparing what was read", topic, caught_up_timeout_s
                    )
                    caught_up = True
            if caught_up and (
                timeout_s <= 0 or expected is None or expected <= seen or now - start > timeout_s
            ):
                break
    finally:
        c.close()
    return out


def _fmt(v: float | None, pct: bool = False) -> str:
    if v is None:
        return "n/a"
    return f"{v:.4f}" if pct else f"{v:,.0f}"


def result_table(res: VerifyResult) -> Table:
    """Per type and overall; fits an 80-column terminal with every type name whole."""
    t = compact_table("verify: alerts vs ground truth")
    t.caption = "exp, obs, ok: expected, observed, matched; p50, p99: delay"
    t.caption_justify = "left"
    t.add_column("type", no_wrap=True)
    for col in ("exp", "obs", "ok", "precision", "recall", "dups", "p50 ms", "p99 ms"):
        t.add_column(col, justify="right", no_wrap=True)
    rows = [*sorted(res.by_type.items()), ("ALL", res.overall)]
    for name, s in rows:
        t.add_row(
            two_lines(name),
            str(s.expected),
            str(s.observed),
            str(s.matched),
            _fmt(s.precision, True),
            _fmt(s.recall, True),
            str(s.duplicates),
            _fmt(s.delay(50)),
            _fmt(s.delay(99)),
        )
    return t


def _fix_cell(a: TruthAlert | ObservedAlert | None) -> str:
    if a is None:
        return "-"
    where = f"{a.lat:.5f},{a.lon:.5f}" if a.lat is not None and a.lon is not None else "-"
    return f"seq {a.seq}\n{ms_to_iso(a.ts_ms)}\n{where}"


def mismatch_table(res: VerifyResult, cap: int = MISMATCH_CAP) -> Table | None:
    """Every disagreement (the first `cap`, the rest counted in the title): vehicle, type and zone,
    the expected fix against the observed one. None when there is none."""
    found = res.mismatches
    if not found:
        return None
    more = f", {len(found) - cap} more not listed" if len(found) > cap else ""
    t = compact_table(f"mismatches: {len(found)}{more}")
    for col in ("kind", "vehicle / type / zone", "expected fix", "observed fix"):
        t.add_column(col, no_wrap=True)
    for m in found[:cap]:
        who = f"{m.vehicle_id}\n{two_lines(m.type)}" + ("" if m.zone_id is None else f"\nzone {m.zone_id}")
        t.add_row(m.kind, who, _fix_cell(m.expected), _fix_cell(m.observed))
    return t
