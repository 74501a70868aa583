"""The launchers' fixtures: a private Kafka broker a test may kill."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from embedded import infra
from fleetfence.mqtt import account_fields
from fleetfence.settings import Settings


@pytest.fixture
def own_kafka(tmp_path: Path, infra_settings: Settings) -> Iterator[Settings]:
    """A private broker of this test's own (it gets killed), beside the session's MQTT and Redis."""
    fields = infra.private_fields(tmp_path / "own")
    s = Settings(
        **{
            **fields,
            "mqtt_url": f"mqtt://{infra_settings.host}:{infra_settings.mqtt_port}",
            "redis_url": infra_settings.redis_dsn,
            **account_fields(infra_settings),
        },
        startup_timeout_s=90,
        topic_prefix=f"own{uuid.uuid4().hex[:6]}.",
    )
    try:
        infra.up(s, create_topics=False)
        yield s
    finally:
        infra.down(s)
