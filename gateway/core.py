"""Pure routing of one MQTT message to one Kafka record: no I/O, no clock, no globals.

The gateway's I/O loop calls `route` for every message and produces whatever it returns, so all
decisions about "valid or dead letter, with which key, value and headers" are testable without a
broker, and the hot path stays one function call.
"""

from __future__ import annotations

import logging
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
