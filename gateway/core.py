"""Pure routing of one MQTT message to one Kafka record: no I/O, no clock, no globals.

The gateway's I/O loop calls `route` for every message and produces whatever it returns, so all
decisions about "valid or dead letter, with which key, value and headers" are testable without a
broker, and the hot path stays one function call.
"""

from __future__ import annotations

import logging
import zlib
from dataclasses import dataclass

from fleetfence.contracts import DlqHeaders, DlqReason, fast_canonical, validate_telemetry
from fleetfence.contracts import dead_letter as dead_letter_record
from fleetfence.errors import ContractError
from fleetfence.settings import TopicNames

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Record:
    """A Kafka record to produce; `reason` is None for valid telemetry."""

    topic: str
    key: bytes
    value: bytes
    headers: DlqHeaders | None
    reason: str | None


@dataclass(frozen=True, slots=True)
class Shard:
    """The vehicles one gateway replica forwards: those whose `shard_of` is `index`, of `count`.

    Why shards and not an MQTT shared subscription: a shared subscription hands a vehicle's
    messages round-robin to every replica, so a replica that holds its share (cut off from Kafka,
    frozen) lets the others forward the same vehicle's later fixes first, and the held ones reach
    Kafka out of order, later than the processor waits for a missing fix. With shards every replica
    receives every message and forwards only its own vehicles', so each vehicle has one path into
    Kafka and a held replica delays its vehicles without reordering them. The rest it acknowledges
    without producing: each of them is another replica's, which receives the same message through
    its own subscription (or finds it queued in its persistent session when it comes back).
    """

    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        if self.count < 1 or not 0 <= self.index < self.count:
            raise ValueError(f"shard {self.index}/{self.count}: need 0 <= index < count")

    def owns(self, mqtt_topic: bytes) -> bool:
        """Whether this replica forwards `mqtt_topic`'s message (its dead letter included)."""
        return self.count == 1 or shard_of(mqtt_topic, self.count) == self.index


def shard_of(mqtt_topic: bytes, count: int) -> int:
    """The shard of a telemetry topic `fleet/<vehicle>/telemetry`: CRC-32 of the vehicle segment.

    Computed from the topic's bytes, not the payload, so a malformed payload has an owner too and
    every message is forwarded or dead-lettered by exactly one replica. The hash is stable across
    processes and versions (Python's `hash` is salted per process); a topic of another shape (the
    subscription admits none) belongs to shard 0.
    """
    parts = mqtt_topic.split(b"/", 2)
    if len(parts) < 3:
        return 0
    return zlib.crc32(parts[1]) % count


def shard_coverage(served: dict[str, tuple[int, int]]) -> list[str]:
    """What is wrong with the running replicas' shards (`{replica: (index, count)}`); [] when each
    index below one agreed count has a replica. A shard without one is acknowledged by the others
    and lost, so an operator's check (`fleetfence status`) fails on it; a shard with two replicas only
    duplicates, which the processor drops by seq, and is reported for the same reason a rollout
    leaves it: to be finished."""
    if not served:
        return []
    counts = sorted({count for _index, count in served.values()})
    if len(counts) > 1:
        return [f"gateway replicas disagree on the shard count: {', '.join(map(str, counts))}"]
    count = counts[0]
    by_index: dict[int, list[str]] = {}
    for replica, (index, _count) in sorted(served.items()):
        by_index.setdefault(index, []).append(replica)
    problems = [
        f"shard {i} of {count} has no running gateway: its vehicles' fixes are lost"
        for i in range(count)
        if i not in by_index
    ]
    problems += [
        f"shard {i} of {count} is served by {len(r)} gateways ({', '.join(r)})"
        for i, r in sorted(by_index.items())
        if len(r) > 1
    ]
    return problems


def dead_letter(
    topics: TopicNames, mqtt_topic: str | bytes, payload: bytes, *, reason: str, detail: str, now_ms: int
) -> Record:
    """The DLQ record of docs/contracts.md, keyed by the MQTT topic."""
    key = mqtt_topic if isinstance(mqtt_topic, bytes) else mqtt_topic.encode("utf-8", "replace")
    value, headers = dead_letter_record(
        payload, reason=reason, detail=detail, origin=("mqtt_topic", key), received_ms=now_ms
    )
    return Record(topics.telemetry_dlq, key, value, headers, reason)


def route(topics: TopicNames, mqtt_topic: str | bytes, payload: bytes, now_ms: int) -> Record:
    """Valid telemetry -> canonical record keyed by vehicle; anything else -> dead letter.

    Never raises: an exception escaping the validator would be a bug, and a bug must cost one
    dead letter (reason `internal_error`, logged with its traceback), not the gateway.
    """
    try:
        if isinstance(mqtt_topic, bytes):
            raise ContractError(DlqReason.BAD_TOPIC, "topic is not valid UTF-8")
        fast = fast_canonical(mqtt_topic, payload, now_ms)
        if fast is not None:
            return Record(topics.telemetry, fast[0].encode(), fast[1], None, None)
        fix = validate_telemetry(mqtt_topic, payload, now_ms)
        return Record(topics.telemetry, fix.vehicle_id.encode(), fix.to_json(), None, None)
    except ContractError as exc:
        return dead_letter(topics, mqtt_topic, payload, reason=exc.reason, detail=str(exc), now_ms=now_ms)
    except Exception as exc:
        logger.exception("validator failed unexpectedly topic=%r size=%s", mqtt_topic, len(payload))
        return dead_letter(
            topics,
            mqtt_topic,
            payload,
            reason=DlqReason.INTERNAL_ERROR,
            detail=f"{type(exc).__name__}: {exc}",
            now_ms=now_ms,
        )
