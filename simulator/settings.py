"""Simulator settings (pydantic-settings, `FLEETFENCE_*`): the shared ones plus the simulator's.

The processor-wide alert rules the ground truth must assume are read from the *same* variables the
processor reads (`FLEETFENCE_PROCESSOR_LATENESS_S`, ...: `ProcessorRulesSettings`, which both
settings derive from), so a deployment that changes them changes both sides at once.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

from pydantic import Field

from fleetfence.errors import ConfigError
from fleetfence.settings import ProcessorRulesSettings


class SimulatorSettings(ProcessorRulesSettings):
    simulator_api_url: str | None = Field(
        default=None, description="Register through the admin API at this URL instead of Redis directly."
    )
    simulator_api_key: str | None = Field(default=None, description="Admin API key for --api-url.")
    simulator_mqtt_inflight: int = Field(
        default=1000, ge=1, le=65535, description="MQTT QoS 1 in-flight window."
    )
    simulator_mqtt_url: str | None = Field(
        default=None,
        description="Where the simulated vehicles connect, as a real fleet does: "
        "mqtts://host:8883 (TLS, verified with FLEETFENCE_SIMULATOR_MQTT_CA) or mqtt://host:port, "
        "or several of them separated by commas (the device edge's replicas: each vehicle starts on "
        "one and moves to the next when it cannot connect); unset: FLEETFENCE_MQTT_URL (or the "
        "embedded broker).",
    )
    simulator_mqtt_ca: Path | None = Field(
        default=None, description="CA certificate that signed the broker's TLS certificate (mqtts://)."
    )

    def vehicle_brokers(self) -> list[tuple[str, int, Path | None]]:
        """(host, port, CA file for TLS or None) of each endpoint the simulated vehicles connect to."""
        if self.simulator_mqtt_url is None:
            return [(*self.mqtt_host_port, None)]
        return [self._endpoint(url.strip()) for url in self.simulator_mqtt_url.split(",") if url.strip()]

    def _endpoint(self, url: str) -> tuple[str, int, Path | None]:
        u = urlparse(url)
        if u.scheme not in ("mqtt", "mqtts") or not u.hostname:
            raise ConfigError(f"FLEETFENCE_SIMULATOR_MQTT_URL must look like mqtts://host:port, got {url!r}")
        if u.scheme == "mqtt":
            return u.hostname, u.port or 1883, None
        if self.simulator_mqtt_ca is None:
            raise ConfigError("FLEETFENCE_SIMULATOR_MQTT_URL=mqtts://... needs FLEETFENCE_SIMULATOR_MQTT_CA")
        return u.hostname, u.port or 8883, self.simulator_mqtt_ca
