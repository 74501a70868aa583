"""Shared by the gateway's tests and their fixtures (conftest.py)."""

from __future__ import annotations

import uuid
from typing import Any

from fleetfence.settings import Settings
from gateway.settings import GatewaySettings


def gw_settings(settings: Settings, **over: Any) -> GatewaySettings:
    """Gateway settings on the test's services, with a client id of their own (one shard of one)."""
    base = GatewaySettings(**settings.model_dump(exclude={"topics"}))
    tag = uuid.uuid4().hex[:8]
    upd: dict[str, Any] = {
        "gateway_client_id": f"gw-test-{tag}",
        "gateway_metrics_port": 0,
        "gateway_kafka_linger_ms": 2,
    }
    upd.update(over)
    return base.model_copy(update=upd)
