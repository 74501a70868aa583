"""Gateway settings: the shared `Settings` plus the knobs only the gateway reads.

Every field is an environment variable `FLEETFENCE_GATEWAY_*` (pydantic-settings), so a replica
is configured the same way in a test, under systemd or in a container.
"""

from __future__ import annotations

import socket
from typing import Literal

from pydantic import Field, model_validator

from fleetfence.settings import Settings
from gateway.core import Shard

# The replica's Prometheus endpoint; when this default is busy (a second replica on the host) it
# serves on an ephemeral port and announces that one (fleetfence.metrics, fleetfence.registry).
GATEWAY_METRICS_PORT = 9464


class GatewaySettings(Settings):
    """Shared settings plus the gateway's own (see the README's configuration table)."""

    gateway_client_id: str = Field(
        default="",
        description="MQTT client id; stable per replica so the broker keeps its session across "
        "restarts. Empty: fleetfence-gw-<hostname>.",
    )
    gateway_shard_index: int = Field(
        default=0, ge=0, description="This replica's shard: it forwards the vehicles of this shard."
    )
    gateway_shard_count: int = Field(
        default=1,
        ge=1,
        description="How many shards the fleet's vehicles are spread over: one replica per shard, "
        "every shard index from 0 to count - 1 served by a running replica.",
    )
    gateway_receive_maximum: int = Field(
        default=2000, ge=1, le=65535, description="MQTT Receive Maximum: the in-flight bound."
    )
    gateway_session_expiry_s: int = Field(
        default=3600, ge=0, description="How long Mosquitto keeps the session (and queues) while down."
    )
    gateway_keepalive_s: int = Field(default=30, ge=5)
    gateway_ack_in_order: bool = Field(
        default=True,
        description="Send PUBACKs in receive order (MQTT 5 section 4.6); false acks as Kafka confirms.",
    )
    gateway_metrics_port: int = Field(
        default=GATEWAY_METRICS_PORT,
        ge=0,
        le=65535,
        description="Prometheus /metrics port, 0 disables it; the default, when busy, falls back to "
        "an ephemeral port.",
    )
    gateway_drain_timeout_s: float = Field(default=30.0, gt=0)
    gateway_kafka_linger_ms: int = Field(default=5, ge=0)
    gateway_kafka_message_timeout_ms: int = Field(
        default=120_000,
        ge=1000,
        description="After this librdkafka gives a record up; the gateway then produces it again.",
    )
    gateway_retry_backoff_ms: int = Field(default=500, ge=10)

    # The device edge (gateway.edge): set a port and this replica is where vehicles connect.
    gateway_edge_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="Port of the vehicles' MQTT listener (0: any free port). Set, the gateway is the "
        "device edge: vehicles connect to it and a PUBACK means Kafka has the fix; unset, it reads "
        "the vehicles' messages from Mosquitto.",
    )
    gateway_edge_tls_port: int | None = Field(
        default=None, ge=0, le=65535, description="Its TLS listener (FLEETFENCE_MQTT_TLS_DIR's server pair)."
    )
    gateway_edge_host: str = Field(
        default="", description="Address the listeners bind to; empty: FLEETFENCE_HOST."
    )
    gateway_edge_receive_maximum: int = Field(
        default=100,
        ge=1,
        le=65535,
        description="Unacknowledged messages one device may send (MQTT 5 Receive Maximum; a 3.1.1 "
        "device past it is read no further until Kafka catches up).",
    )
    gateway_edge_max_in_flight: int = Field(
        default=50_000,
        ge=1,
        le=400_000,
        description="Unacknowledged messages of all devices together; past it no device is read.",
    )
    gateway_edge_max_packet_bytes: int = Field(
        default=64 * 1024,
        ge=1024,
        description="Largest MQTT packet a device may send (announced to MQTT 5 devices); a larger "
        "one closes its connection. Payloads up to it but over the contract's 16 KiB are "
        "dead-lettered as too_large.",
    )
    gateway_edge_connect_timeout_s: float = Field(default=10.0, gt=0)
    gateway_teltonika_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="Port of the edge's Teltonika listener (Codec 8 / 8 Extended / 16 over TCP; 0: any "
        "free port); unset: none. Needs the device edge (an edge port) and trackers bound to vehicles.",
    )
    gateway_teltonika_idle_timeout_s: float = Field(
        default=600.0,
        gt=0,
        description="A Teltonika connection silent this long is closed (a unit whose network is gone "
        "sends no FIN; the unit reconnects when it has data).",
    )
    gateway_http_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="Port of the edge's HTTP listener for phone trackers (Traccar Client's OsmAnd "
        "protocol, OwnTracks' HTTP mode; 0: any free port); unset: none.",
    )
    gateway_https_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="The same listener over TLS, with the edge's certificate "
        "(FLEETFENCE_MQTT_TLS_DIR); OwnTracks' password travels in every request, so use this one.",
    )
    gateway_osmand_speed_unit: Literal["kn", "kmh", "mps", "mph"] = Field(
        default="kn",
        description="Unit of an OsmAnd request's `speed` parameter: knots, as Traccar's server "
        "reads it; Traccar Client's JSON body is always m/s.",
    )
    gateway_http_idle_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="An HTTP connection with no request in flight, silent this long, is closed.",
    )
    gateway_edge_recheck_s: float = Field(
        default=5.0,
        gt=0,
        description="How often connected devices' credentials are read again: a disabled, revoked or "
        "rotated device is disconnected within this.",
    )

    @model_validator(mode="after")
    def _shard_in_range(self) -> GatewaySettings:
        if self.gateway_shard_index >= self.gateway_shard_count:
            raise ValueError(
                f"FLEETFENCE_GATEWAY_SHARD_INDEX={self.gateway_shard_index} must be below "
                f"FLEETFENCE_GATEWAY_SHARD_COUNT={self.gateway_shard_count}"
            )
        return self

    @property
    def gateway_edge_listens(self) -> bool:
        """Whether the replica is the device edge (any device listener set), not Mosquitto's reader."""
        ports = (
            self.gateway_edge_port,
            self.gateway_edge_tls_port,
            self.gateway_teltonika_port,
            self.gateway_http_port,
            self.gateway_https_port,
        )
        return any(p is not None for p in ports)

    @property
    def gateway_shard(self) -> Shard:
        return Shard(self.gateway_shard_index, self.gateway_shard_count)

    @property
    def gateway_client_id_effective(self) -> str:
        return self.gateway_client_id or f"fleetfence-gw-{socket.gethostname()}"

    @property
    def gateway_subscription(self) -> str:
        """Every replica receives every vehicle's messages (`gateway.core.Shard` says why)."""
        return "fleet/+/telemetry"
