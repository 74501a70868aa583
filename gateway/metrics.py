"""Gateway counters and their Prometheus exposition.

The I/O thread bumps plain ints (a `prometheus_client.Counter.inc` takes a lock, several per
message add up at 50k msg/s); a custom collector turns them into metric families when /metrics is
scraped. Each gateway has its own registry, so several can run in one process (tests, benchmark).
"""

from __future__ import annotations

import bisect
import logging
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

if TYPE_CHECKING:
    from collections.abc import Callable

logger = logging.getLogger(__name__)

LATENCY_BUCKETS_S = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    120.0,
)


@dataclass
class GatewayStats:
    """Monotonic counters of one gateway; written only by its I/O thread."""

    received: int = 0  # this replica's shard only; every other counter but other_shard too
    other_shard: int = 0  # another replica's vehicles: acknowledged without producing
    forwarded: int = 0
    dead_lettered: Counter[str] = field(default_factory=Counter)
    acked: int = 0
    acks_dropped: int = 0  # confirmed after the MQTT connection it came on was lost: redelivered
    redelivered: int = 0  # DUP flag set: a copy may already be in Kafka (downstream drops by seq)
    produce_retries: int = 0
    deferred: int = 0  # arrived while draining, left unacknowledged for the next session
    kafka_errors: Counter[str] = field(default_factory=Counter)
    producer_restarts: int = 0
    mqtt_connects: int = 0
    # The device edge's (gateway.edge): device sessions refused by reason, protocol breaches by MQTT 5
    # reason code, connections closed because a newer one of the same device took over.
    logins_refused: Counter[str] = field(default_factory=Counter)
    protocol_errors: Counter[str] = field(default_factory=Counter)
    sessions_taken_over: int = 0
    # Trackers' records (gateway.teltonika_edge) by (protocol, received | forwarded | dead_lettered):
    # each protocol reconciles on its own; the totals above include them.
    tracker_records: Counter[tuple[str, str]] = field(default_factory=Counter)
    latency_counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS_S) + 1))
    latency_sum_s: float = 0.0
    # When these counters started (UTC epoch seconds): a reader summing them over time (the load
    # test) knows a restarted replica by it, even when its new counts already passed the old ones.
    started_s: float = field(default_factory=time.time)

    @property
    def dead_lettered_total(self) -> int:
        return sum(self.dead_lettered.values())

    def observe_latency(self, seconds: float) -> None:
        self.latency_counts[bisect.bisect_left(LATENCY_BUCKETS_S, seconds)] += 1
        self.latency_sum_s += seconds


def log_stats(stats: GatewayStats, in_flight: int) -> None:
    """The periodic one-line summary: the counters in the service log, for a replica nobody scrapes."""
    logger.info(
        "gateway stats received=%s other_shard=%s forwarded=%s dead_lettered=%s acked=%s in_flight=%s "
        "redelivered=%s kafka_errors=%s",
        stats.received,
        stats.other_shard,
        stats.forwarded,
        stats.dead_lettered_total,
        stats.acked,
        in_flight,
        stats.redelivered,
        sum(stats.kafka_errors.values()),
    )


def log_stopped(
    what: str, client_id: str, drained: bool, in_flight: int, unflushed: int, stats: GatewayStats
) -> None:
    """The last line of a stopped replica (`what`: "gateway" or "device edge"): whether it drained,
    and its counters, which a restart resets."""
    logger.info(
        "%s stopped client_id=%s drained=%s in_flight=%s unflushed=%s received=%s forwarded=%s "
        "dead_lettered=%s acked=%s acks_dropped=%s redelivered=%s",
        what,
        client_id,
        drained,
        in_flight,
        unflushed,
        stats.received,
        stats.forwarded,
        stats.dead_lettered_total,
        stats.acked,
        stats.acks_dropped,
        stats.redelivered,
    )


class GatewayCollector(Collector):
    """Reads a `GatewayStats` (and live gauges) at scrape time."""

    def __init__(
        self,
        stats: GatewayStats,
        in_flight: Callable[[], int],
        connected: Callable[[], bool],
        shard: tuple[int, int] | None = (0, 1),
        devices_connected: Callable[[], int] | None = None,
    ) -> None:
        self.stats = stats
        self.devices_connected = devices_connected
        self.shard = shard
        self.in_flight = in_flight
        self.connected = connected

    def collect(self) -> Iterator[Metric]:
        s = self.stats
        p = "fleetfence_gateway_"
        yield CounterMetricFamily(p + "received", "MQTT messages of this replica's shard", value=s.received)
        yield CounterMetricFamily(
            p + "other_shard", "MQTT messages of other replicas' shards, not produced", value=s.other_shard
        )
        yield CounterMetricFamily(p + "forwarded", "valid fixes stored in fleet.telemetry", value=s.forwarded)
        dl = CounterMetricFamily(
            p + "dead_lettered", "messages stored in fleet.telemetry.dlq", labels=["reason"]
        )
        for reason, n in sorted(s.dead_lettered.items()):
            dl.add_metric([reason], n)
        yield dl
        yield CounterMetricFamily(
            p + "acked", "acknowledgements sent, once Kafka confirmed all they cover", value=s.acked
        )
        yield CounterMetricFamily(
            p + "acks_dropped", "confirmations whose MQTT connection was gone", value=s.acks_dropped
        )
        yield CounterMetricFamily(
            p + "redelivered", "messages received with the DUP flag", value=s.redelivered
        )
        yield CounterMetricFamily(p + "produce_retries", "records produced again", value=s.produce_retries)
        yield CounterMetricFamily(
            p + "deferred", "arrived while draining, left to the next session", value=s.deferred
        )
        ke = CounterMetricFamily(p + "kafka_errors", "Kafka delivery/client errors", labels=["error"])
        for name, n in sorted(s.kafka_errors.items()):
            ke.add_metric([name], n)
        yield ke
        yield CounterMetricFamily(p + "producer_restarts", "producers replaced", value=s.producer_restarts)
        yield CounterMetricFamily(p + "mqtt_connects", "MQTT (re)connections", value=s.mqtt_connects)
        yield GaugeMetricFamily(
            p + "start_time_seconds", "when this replica's counters started, UTC epoch", value=s.started_s
        )
        yield GaugeMetricFamily(p + "in_flight", "received, not yet acknowledged", value=self.in_flight())
        yield GaugeMetricFamily(p + "mqtt_connected", "1 when subscribed", value=int(self.connected()))
        # Which shard this replica serves: a dashboard can check that each index of the count is up once.
        if self.shard is not None:  # a device edge has none: its vehicles choose the replica
            info = GaugeMetricFamily(
                p + "shard", "this replica's shard (index of count)", labels=["index", "count"]
            )
            info.add_metric([str(self.shard[0]), str(self.shard[1])], 1)
            yield info
        if self.devices_connected is not None:  # the device edge (gateway.edge)
            yield GaugeMetricFamily(
                p + "devices_connected", "device connections logged in", value=self.devices_connected()
            )
            lr = CounterMetricFamily(p + "logins_refused", "device logins refused", labels=["reason"])
            for reason, n in sorted(s.logins_refused.items()):
                lr.add_metric([reason], n)
            yield lr
            pe = CounterMetricFamily(
                p + "protocol_errors", "device connections closed for a protocol breach", labels=["code"]
            )
            for code, n in sorted(s.protocol_errors.items()):
                pe.add_metric([code], n)
            yield pe
            tr = CounterMetricFamily(
                p + "tracker_records",
                "trackers' records received, then forwarded or dead-lettered",
                labels=["protocol", "outcome"],
            )
            for (protocol, outcome), n in sorted(s.tracker_records.items()):
                tr.add_metric([protocol, outcome], n)
            yield tr
            yield CounterMetricFamily(
                p + "sessions_taken_over",
                "device connections closed by a newer one of the same device",
                value=s.sessions_taken_over,
            )
        buckets: list[tuple[str, float]] = []
        acc = 0
        for bound, n in zip(LATENCY_BUCKETS_S, s.latency_counts, strict=False):
            acc += n
            buckets.append((repr(bound), acc))
        acc += s.latency_counts[-1]
        buckets.append(("+Inf", acc))
        yield HistogramMetricFamily(
            p + "kafka_delivery_latency_seconds",
            "produce() to Kafka confirmation",
            buckets=buckets,
            sum_value=s.latency_sum_s,
        )


def make_registry(collector: GatewayCollector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry
