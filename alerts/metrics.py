"""Prometheus metrics per receiver (label `receiver`), plus a plain snapshot for in-process use.

The metric families are created once per registry (prometheus_client refuses duplicates), so
several services in one process (tests, the demo) share them under different receiver labels, and
tests pass a private registry to read exact values.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge

# Keyed by the registry itself, weakly: an id() key outlives its registry, and a new registry that
# reuses the address would be handed families registered in the dead one (its samples never seen).
_families: weakref.WeakKeyDictionary[CollectorRegistry, _Families] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


class _Families:
    def __init__(self, registry: CollectorRegistry) -> None:
        label = ["receiver"]
        self.consumed = Counter(
            "fleetfence_alert_receiver_consumed", "Records read from fleet.alerts.", label, registry=registry
        )
        self.delivered = Counter(
            "fleetfence_alert_receiver_delivered", "Side effects performed.", label, registry=registry
        )
        self.retried = Counter(
            "fleetfence_alert_receiver_retried",
            "Delivery attempts repeated after a failure.",
            label,
            registry=registry,
        )
        self.dead_lettered = Counter(
            "fleetfence_alert_receiver_dead_lettered",
            "Records sent to fleet.alerts.dlq.",
            label,
            registry=registry,
        )
        self.duplicates = Counter(
            "fleetfence_alert_receiver_duplicates",
            "Alerts skipped because already handled.",
            label,
            registry=registry,
        )
        self.filtered = Counter(
            "fleetfence_alert_receiver_filtered",
            "Alerts this receiver's filter does not want.",
            label,
            registry=registry,
        )
        self.held = Gauge(
            "fleetfence_alert_receiver_held",
            "Alerts a batching receiver (e-mail) holds for its next message; their offsets wait.",
            label,
            registry=registry,
        )
        self.released = Counter(
            "fleetfence_alert_receiver_released",
            "Held alerts dropped unsent when their partition left this consumer (revoked, lost, "
            "replaced or stopping); uncommitted, they are read again by the partition's next owner.",
            label,
            registry=registry,
        )
        self.messages = Counter(
            "fleetfence_alert_receiver_messages_sent",
            "Messages a batching receiver sent (e-mail: one per recipient and interval).",
            label,
            registry=registry,
        )
        self.consumers_replaced = Counter(
            "fleetfence_alert_receiver_consumers_replaced",
            "Kafka consumers the receiver replaced in place after a fatal consumer error.",
            label,
            registry=registry,
        )
        self.lag = Gauge(
            "fleetfence_alert_receiver_lag_messages",
            "Records behind the end of fleet.alerts.",
            label,
            registry=registry,
        )


def families(registry: CollectorRegistry | None = None) -> _Families:
    reg = registry or REGISTRY
    with _lock:
        fam = _families.get(reg)
        if fam is None:
            fam = _families[reg] = _Families(reg)
        return fam


@dataclass
class Snapshot:
    consumed: int = 0
    delivered: int = 0
    retried: int = 0
    dead_lettered: int = 0
    duplicates: int = 0
    filtered: int = 0
    released: int = 0
    held: int = 0
    messages: int = 0
    consumers_replaced: int = 0
    lag: int = -1

    @property
    def reconciles(self) -> bool:
        """Every consumed record ended in exactly one bucket (the 'counts reconcile' invariant). An
        alert a batching receiver holds is in none yet: it is counted when its message went out, or
        as released when its partition left this consumer before that (its next reader consumes
        it again, so `consumed` counts it twice and the two buckets once each)."""
        return (
            self.consumed
            == self.delivered + self.dead_lettered + self.duplicates + self.filtered + self.released
        )


class ReceiverMetrics:
    """Counters of one receiver, mirrored into Prometheus."""

    def __init__(self, receiver: str, registry: CollectorRegistry | None = None) -> None:
        fam = families(registry)
        self._c = fam.consumed.labels(receiver)
        self._d = fam.delivered.labels(receiver)
        self._r = fam.retried.labels(receiver)
        self._x = fam.dead_lettered.labels(receiver)
        self._u = fam.duplicates.labels(receiver)
        self._f = fam.filtered.labels(receiver)
        self._lag = fam.lag.labels(receiver)
        self._held = fam.held.labels(receiver)
        self._m = fam.messages.labels(receiver)
        self._rel = fam.released.labels(receiver)
        self._replaced = fam.consumers_replaced.labels(receiver)
        self._snap = Snapshot()
        self._lock = threading.Lock()

    def snapshot(self) -> Snapshot:
        with self._lock:
            return Snapshot(**vars(self._snap))

    def consumed(self, n: int = 1) -> None:
        with self._lock:
            self._snap.consumed += n
        self._c.inc(n)

    def delivered(self) -> None:
        with self._lock:
            self._snap.delivered += 1
        self._d.inc()

    def retried(self) -> None:
        with self._lock:
            self._snap.retried += 1
        self._r.inc()

    def dead_lettered(self) -> None:
        with self._lock:
            self._snap.dead_lettered += 1
        self._x.inc()

    def duplicate(self) -> None:
        with self._lock:
            self._snap.duplicates += 1
        self._u.inc()

    def filtered(self) -> None:
        with self._lock:
            self._snap.filtered += 1
        self._f.inc()

    def held(self, n: int) -> None:
        with self._lock:
            self._snap.held = n
        self._held.set(n)

    def released(self, n: int) -> None:
        with self._lock:
            self._snap.released += n
        self._rel.inc(n)

    def message_sent(self) -> None:
        with self._lock:
            self._snap.messages += 1
        self._m.inc()

    def consumer_replaced(self) -> None:
        with self._lock:
            self._snap.consumers_replaced += 1
        self._replaced.inc()

    def lag(self, n: int) -> None:
        with self._lock:
            self._snap.lag = n
        self._lag.set(n)
