"""What the load test reads while it runs: from Kafka, the committed alerts and the processor's
commit markers of this run, every record written to `fleet.telemetry` and the gateways' dead letters
(which of the run's fixes Kafka holds, and how often), and the receivers' consumer-group lag; from
the gateways' metrics, their own counts. Incremental and non-blocking: the sampler calls `poll()`
once a second, so a long soak never re-reads a topic from its start.

The run is counted in Kafka, not in the services: a gateway SIGKILLed and restarted during the run
(its counters back at zero, and what it counted since the last reading gone) changes nothing that
decides whether the run reconciles.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from http.client import HTTPException
from typing import Any

import msgspec
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from fleetfence.contracts import vehicle_from_topic
from fleetfence.errors import ContractError, ServiceUnavailableError
from fleetfence.kafka import committed_reader, watermarks
from fleetfence.metrics import scrape
from processor.ops.markers import MarkerReader

logger = logging.getLogger(__name__)


def _consumer(bootstrap: str, group: str) -> Consumer:
    return committed_reader(bootstrap, group, **{"enable.partition.eof": False})


def _partitions(c: Consumer, topic: str) -> list[int]:
    md = c.list_topics(topic, timeout=10).topics.get(topic)
    if md is None or md.error is not None or not md.partitions:
        from loadtest.errors import LoadtestError

        raise LoadtestError(f"topic {topic} does not exist")
    return sorted(md.partitions)


class TopicTap:
    """Every committed record of `topic` produced after the tap was opened."""

    def __init__(self, bootstrap: str, topic: str, group: str) -> None:
        self.topic = topic
        self.c = _consumer(bootstrap, group)
        parts = _partitions(self.c, topic)
        starts = []
        for p in parts:
            _lo, hi = watermarks(self.c, topic, p)
            starts.append(TopicPartition(topic, p, hi))
        self.c.assign(starts)
        # Per partition, the offset after the newest data record read (control records of
        # transactions take offsets too, so the topic's end is not where the data ends).
        self.data_end: dict[int, int] = {tp.partition: tp.offset for tp in starts}
        self.start = dict(self.data_end)

    def poll_messages(self, max_records: int = 100_000, wait_s: float = 0.05) -> list[Message]:
        """The data records that arrived since the last call, waiting up to `wait_s` for more when
        none is left (0: only what the client has fetched already)."""
        out: list[Message] = []
        while len(out) < max_records:
            msgs = self.c.consume(10_000, wait_s)
            if not msgs:
                break
            for m in msgs:
                err = m.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        logger.warning("loadtest tap error topic=%s error=%s", self.topic, err)
                    continue
                out.append(m)
                self.data_end[m.partition()] = m.offset() + 1
        return out

    def poll(self, max_records: int = 100_000) -> list[tuple[bytes, int]]:
        """(value, record timestamp ms) of what arrived since the last call."""
        return [(m.value() or b"", int(m.timestamp()[1])) for m in self.poll_messages(max_records)]

    def close(self) -> None:
        self.c.close()


@dataclass
class MarkerTotals:
    """The processor's committed batches of this run, summed (docs/contracts.md, commit markers)."""

    batches: int = 0
    received: int = 0
    invalid: int = 0
    accepted: int = 0
    duplicates: int = 0
    late: int = 0
    held: int = 0  # of the newest marker: fixes waiting for a missing seq
    alerts: int = 0
    # Per sink (the job's, the proximity query's): the newest commit and the intervals between
    # the last few, the batches' pace.
    last_committed_ms: dict[str, int] = field(default_factory=dict)
    recent_gaps_ms: dict[str, tuple[int, ...]] = field(default_factory=dict)
    seen: set[tuple[str, Any]] = field(default_factory=set, repr=False)

    @property
    def read(self) -> int:
        """Telemetry records the processor has read: every one is received or invalid."""
        return self.received + self.invalid

    def add(self, m: dict[str, Any]) -> None:
        # One marker per sink and batch: a marker the reader is handed again (a fetch repeated
        # after the markers topic's leader moved, in a two-of-three outage) counts once.
        key = (str(m.get("sink_id", "")), m.get("batch_id"))
        if key[1] is not None:
            if key in self.seen:
                return
            self.seen.add(key)
        self.batches += 1
        for k in ("received", "invalid", "accepted", "duplicates", "late", "alerts"):
            setattr(self, k, getattr(self, k) + int(m.get(k, 0)))
        self.held = int(m.get("held", 0))
        sink, at = str(m.get("sink_id", "")), int(m.get("committed_ms") or 0)
        if at and sink in self.last_committed_ms:
            gaps = self.recent_gaps_ms.get(sink, ())
            self.recent_gaps_ms[sink] = (*gaps[-2:], max(0, at - self.last_committed_ms[sink]))
        if at:
            self.last_committed_ms[sink] = at

    @property
    def batch_pace_s(self) -> float:
        """The longest of the last three intervals between committed batches: how long the
        processor takes now to come back with what follows a batch (a timer's alert comes one
        batch after the fix that armed it; after a failover a batch can take a minute)."""
        return max((g for gaps in self.recent_gaps_ms.values() for g in gaps), default=0) / 1000


class MarkerTap:
    """The processor's commit markers of this run, summed; read through the processor's own
    `MarkerReader` (from the topic's end when opened)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.reader = MarkerReader(bootstrap, topic)
        self.totals = MarkerTotals()

    def poll(self) -> MarkerTotals:
        while markers := self.reader.poll(0.05):
            for m in markers:
                self.totals.add(m)
        return self.totals

    def close(self) -> None:
        self.reader.close()


class GroupLag:
    """Data records of a topic not yet committed by each consumer group (the alert receivers),
    measured against what a `TopicTap` of the same topic has read."""

    def __init__(self, bootstrap: str, tap: TopicTap, groups: list[str]) -> None:
        self.tap = tap
        self.consumers = {g: _consumer(bootstrap, g) for g in groups}
        self.parts = [TopicPartition(tap.topic, p) for p in sorted(tap.data_end)]
        self.last: dict[str, int] = {}

    def lag(self) -> int:
        """The largest lag over the groups (the slowest receiver). A group whose committed offsets
        cannot be read now (its coordinator moving to another broker: a broker lost) keeps its last
        reading: a measurement, not a reason to stop the run."""
        worst = 0
        for g, c in self.consumers.items():
            try:
                committed = c.committed(self.parts, timeout=5)
            except KafkaException as exc:
                logger.warning("loadtest committed offsets unreadable group=%s error=%s", g, exc)
                worst = max(worst, self.last.get(g, 0))
                continue
            total = 0
            for tp in committed:
                p = tp.partition
                # Not committed yet (a negative offset), or before this run: this run's start.
                done = max(tp.offset, self.tap.start[p])
                total += max(self.tap.data_end[p] - done, 0)
            self.last[g] = total
            worst = max(worst, total)
        return worst

    def close(self) -> None:
        for c in self.consumers.values():
            c.close()


class _FixKey(msgspec.Struct):
    """What identifies a fix (docs/contracts.md): its vehicle and that vehicle's sequence number.
    Any JSON object with these two fields: the canonical record, and the simulator's payload a
    dead letter carries."""

    vehicle_id: str
    seq: int


_decode_key = msgspec.json.Decoder(_FixKey).decode
SPAN_MARGIN = 4096  # room below a vehicle's first seq for fixes of its that come out of order
MAX_SPAN = 50_000_000  # seqs further than this from a vehicle's first are kept in a set


class FixLedger:
    """Which fixes of the vehicles whose ids start with `prefix` (the run's) have been seen: per
    vehicle a bitmap of its seqs from a base near its first one (the simulator's seqs start at the
    run's epoch time over the fix period, about 1.8e9), so a soak of millions of fixes costs a
    byte each."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._seen: dict[str, tuple[int, bytearray]] = {}  # vehicle -> (base seq, bitmap)
        self._odd: set[tuple[str, int]] = set()  # seqs too far from the vehicle's others
        self.distinct = 0

    def mine(self, vehicle_id: str) -> bool:
        return vehicle_id.startswith(self.prefix)

    @property
    def bitmap_bytes(self) -> int:
        return sum(len(bits) for _base, bits in self._seen.values())

    def add(self, vehicle_id: str, seq: int) -> bool:
        """Record a fix of the run; False when it was seen before."""
        entry = self._seen.get(vehicle_id)
        if entry is None:
            entry = self._seen[vehicle_id] = (seq - SPAN_MARGIN, bytearray(2 * SPAN_MARGIN))
        base, bits = entry
        i = seq - base
        if i < 0 and len(bits) - i <= MAX_SPAN:  # before the bitmap: it grows downwards
            grow = -i + SPAN_MARGIN
            bits[:0] = bytes(grow)
            base -= grow
            self._seen[vehicle_id] = (base, bits)
            i = seq - base
        elif i >= len(bits) and i < MAX_SPAN:
            bits.extend(bytes(max(i + 1 - len(bits), len(bits))))
        if not 0 <= i < len(bits):
            if (vehicle_id, seq) in self._odd:
                return False
            self._odd.add((vehicle_id, seq))
            self.distinct += 1
            return True
        if bits[i]:
            return False
        bits[i] = 1
        self.distinct += 1
        return True


@dataclass
class KafkaCounts:
    """What Kafka holds since the run started."""

    records: int = 0  # every record written to fleet.telemetry (the processor must read them all)
    fixes: int = 0  # the run's fixes in fleet.telemetry, each counted once
    sent_again: int = 0  # the run's records in fleet.telemetry beyond a fix's first
    dead_lettered: int = 0  # the run's messages the gateways dead-lettered, each once


def _dead_letter_key(m: Message) -> tuple[str, int | None] | None:
    """(vehicle, seq) of a gateway's dead letter (seq None when its bytes say none); None for the
    processor's own dead letters (its `source` header: records already in fleet.telemetry) and for
    bytes that name no vehicle."""
    headers = dict(m.headers() or [])
    if "source" in headers:
        return None
    try:
        key = _decode_key(m.value() or b"")
    except msgspec.DecodeError:
        topic = headers.get("mqtt_topic")
        if topic is None:
            return None
        try:
            return vehicle_from_topic(topic.decode("utf-8", "replace")), None
        except ContractError:
            return None
    return key.vehicle_id, key.seq


def _ends(tap: TopicTap, timeout_s: float) -> dict[int, int] | None:
    """Each partition's end as its leader says now, asked once (no wait through an outage, unlike
    `fleetfence.kafka.watermarks`: a sampler must not stall); None when a leader does not answer."""
    try:
        return {
            p: int(tap.c.get_watermark_offsets(TopicPartition(tap.topic, p), timeout_s, False)[1])
            for p in tap.start
        }
    except KafkaException:
        return None


class TelemetryTap:
    """Every record of `fleet.telemetry` and `fleet.telemetry.dlq` written after the tap was opened:
    how many the processor must read, and which of the run's fixes Kafka holds, how often."""

    def __init__(self, bootstrap: str, telemetry: str, dlq: str, group: str, prefix: str) -> None:
        self.fixes = TopicTap(bootstrap, telemetry, group)
        try:
            self.dead = TopicTap(bootstrap, dlq, f"{group}-dlq")
        except BaseException:
            self.fixes.close()
            raise
        self.ledger = FixLedger(prefix)
        self.counts = KafkaCounts()
        # The run's dead letters that name no seq (bytes that are not a fix), by vehicle and
        # content: the same message sent again after a lost PUBACK is one dead letter.
        self._unnumbered: set[tuple[str, int]] = set()

    def poll(self, wait_s: float = 0.0) -> KafkaCounts:
        """Count what the client has fetched since the last call (the sampler's, each second:
        librdkafka fetches in the background); `wait_s` for more when none is left."""
        c, ledger = self.counts, self.ledger
        for m in self.fixes.poll_messages(wait_s=wait_s):
            c.records += 1
            try:
                key = _decode_key(m.value() or b"")
            except msgspec.DecodeError:
                continue  # not a fix of the run (the processor dead-letters it)
            if ledger.mine(key.vehicle_id):
                if ledger.add(key.vehicle_id, key.seq):
                    c.fixes += 1
                else:
                    c.sent_again += 1
        for m in self.dead.poll_messages(wait_s=wait_s):
            dk = _dead_letter_key(m)
            if dk is None or not ledger.mine(dk[0]):
                continue
            if dk[1] is None:
                once = (dk[0], zlib.crc32(m.value() or b""))
                if once not in self._unnumbered:
                    self._unnumbered.add(once)
                    c.dead_lettered += 1
            elif ledger.add(dk[0], dk[1]):
                c.dead_lettered += 1
        return c

    def written(self) -> int | None:
        """Records written to fleet.telemetry since the tap was opened, as the partitions' leaders
        say now (its producers are not transactional: every offset is a record); None when a
        leader does not answer (a broker down), and the caller falls back on what was read."""
        ends = _ends(self.fixes, 0.5)
        if ends is None:
            return None
        return sum(max(end - self.fixes.start[p], 0) for p, end in ends.items())

    def _read_up_to_ends(self) -> bool:
        """Every partition of both topics read up to its end as the leaders say now (the tap's
        position, past transactions' control records too, at the end)."""
        for tap in (self.fixes, self.dead):
            ends = _ends(tap, 1.0)
            if ends is None:
                return False
            parts = [TopicPartition(tap.topic, p) for p in sorted(tap.start)]
            try:
                positions = {tp.partition: tp.offset for tp in tap.c.position(parts)}
            except KafkaException:
                return False
            for p, end in ends.items():
                at = max(positions.get(p, -1), tap.data_end[p])
                if end > tap.start[p] and at < end:
                    return False
        return True

    def drain(self, timeout_s: float = 120.0) -> KafkaCounts:
        """Read until the tap has everything the topics hold now (or `timeout_s`: a broker still
        down; the reconciliation then says what it could not count)."""
        deadline = time.monotonic() + timeout_s
        self.poll(wait_s=0.05)
        while not self._read_up_to_ends() and time.monotonic() < deadline:
            self.poll(wait_s=0.2)
        return self.counts

    def close(self) -> None:
        self.fixes.close()
        self.dead.close()


GATEWAY_COUNTERS = (
    "fleetfence_gateway_received_total",
    "fleetfence_gateway_forwarded_total",
    "fleetfence_gateway_dead_lettered_total",
    "fleetfence_gateway_redelivered_total",
)
STARTED = "fleetfence_gateway_start_time_seconds"


@dataclass
class GatewayFigures:
    """The gateway replicas' own counts of this run, summed (received, forwarded, dead-lettered,
    redelivered). `restarts`: replicas seen starting again during the run; their counts between
    the last reading and their end are unknown, so the sums are then a lower bound."""

    received: int = 0
    forwarded: int = 0
    dead_lettered: int = 0
    redelivered: int = 0
    restarts: int = 0
    unanswered: tuple[str, ...] = ()  # replicas whose metrics did not answer at the last reading


@dataclass
class ReplicaCounts:
    """One gateway replica's counters over the run, across its restarts."""

    started_s: float
    at_start: tuple[float, ...]  # its counters when the run (or its new life) began
    last: tuple[float, ...]
    banked: tuple[float, ...] = (0.0,) * len(GATEWAY_COUNTERS)  # its earlier lives' counts

    def seen(self, started_s: float, now: tuple[float, ...]) -> bool:
        """Take a reading; True when it is a new process (its start time changed): what the old one
        counted up to its last reading is kept, the new one counts from zero."""
        restarted = started_s != self.started_s
        if restarted:
            self.banked = self.run_counts()
            self.started_s, self.at_start = started_s, (0.0,) * len(now)
        self.last = now
        return restarted

    def run_counts(self) -> tuple[float, ...]:
        return tuple(b + x - s for b, x, s in zip(self.banked, self.last, self.at_start, strict=True))


class GatewayCounters:
    """The gateways' counts of this run, read from their metrics, across restarts: a replica whose
    start time changed is a new process, counted from zero, what its earlier life counted until its
    last reading kept. A replica that does not answer keeps its last reading (a fault under test)."""

    def __init__(self, urls: Callable[[], dict[str, str]]) -> None:
        self.urls = urls
        self.replicas: dict[str, ReplicaCounts] = {}
        self.restarts = 0
        self.unanswered: tuple[str, ...] = ()
        self.read(first=True)

    def read(self, *, first: bool = False) -> GatewayFigures:
        missing = []
        for name, url in self.urls().items():
            try:
                m = scrape(url)
            except (OSError, ValueError, HTTPException) as exc:  # down, restarting, cut mid-answer
                if first:  # the run's baseline: without it the replica's counts mean nothing
                    raise ServiceUnavailableError(f"{name} metrics at {url}: {exc}") from exc
                missing.append(name)
                logger.warning("loadtest gateway metrics unanswered name=%s url=%s error=%s", name, url, exc)
                continue
            now = tuple(m.total(k) for k in GATEWAY_COUNTERS)
            started = m.total(STARTED)
            rep = self.replicas.get(name)
            if rep is None:
                # Counted before the run (an attached installation's) when present at its start;
                # a replica that joins later counts from zero.
                self.replicas[name] = ReplicaCounts(started, now if first else (0.0,) * len(now), now)
            elif rep.seen(started, now):
                self.restarts += 1
                logger.warning("loadtest a gateway restarted during the run name=%s", name)
        self.unanswered = tuple(missing)
        return self.figures()

    def figures(self) -> GatewayFigures:
        tot = [0.0] * len(GATEWAY_COUNTERS)
        for rep in self.replicas.values():
            tot = [a + b for a, b in zip(tot, rep.run_counts(), strict=True)]
        received, forwarded, dead, redelivered = (int(x) for x in tot)
        return GatewayFigures(
            received=received,
            forwarded=forwarded,
            dead_lettered=dead,
            redelivered=redelivered,
            restarts=self.restarts,
            unanswered=self.unanswered,
        )
