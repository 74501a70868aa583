"""The receivers' dead letters: an alert a receiver cannot handle goes to `fleet.alerts.dlq` with
headers that say why and where it came from, and the runner only moves on once the broker has it."""

from __future__ import annotations

from confluent_kafka import KafkaError, Message, Producer

from alerts.model import SourceRecord
from fleetfence.contracts import utc_now_ms
from fleetfence.errors import KafkaDeliveryError


class DeadLetters:
    """Writes to `fleet.alerts.dlq` and waits for the broker's acknowledgement before returning,
    because the caller then records the alert as handled."""

    def __init__(self, producer: Producer, topic: str, receiver: str) -> None:
        self._p = producer
        self._topic = topic
        self._receiver = receiver

    def send(
        self, source: SourceRecord, value: bytes | None, reason: str, detail: str, **extra: str | int
    ) -> None:
        errors: list[KafkaError] = []

        def on_delivery(err: KafkaError | None, _msg: Message) -> None:
            if err is not None:
                errors.append(err)

        headers: dict[str, str] = {
            "reason": reason,
            "detail": detail[:1000],
            "receiver": self._receiver,
            "source_topic": source.topic,
            "source_partition": str(source.partition),
            "source_offset": str(source.offset),
            "failed_ms": str(utc_now_ms()),
        }
        headers.update({k: str(v) for k, v in extra.items()})
        self._p.produce(
            self._topic, key=source.key, value=value, headers=list(headers.items()), on_delivery=on_delivery
        )
        if self._p.flush(15) != 0:
            raise KafkaDeliveryError(f"dead letter for {source} not acknowledged within 15s")
        if errors:
            raise KafkaDeliveryError(f"dead letter for {source} failed: {errors[0]}")
