"""Key names of the Redis read models (docs/contracts.md, "Redis read models"): one definition for
the processor (live state), the alert history receiver (alerts, open conditions) that write them
and the admin API that reads them, and for the service registry every long-running service writes
and `fleetfence status` reads (`fleetfence.registry`). Every key is under FLEETFENCE_REDIS_PREFIX."""

from __future__ import annotations

import re
from dataclasses import dataclass

_GLOB_SPECIAL = re.compile(r"([*?\[\]\\])")


@dataclass(frozen=True)
class ReadKeys:
    prefix: str

    def live(self, vehicle_id: str) -> str:
        """A vehicle's live state (JSON)."""
        return f"{self.prefix}live:{vehicle_id}"

    @property
    def live_index(self) -> str:
        """Every vehicle with a live state, scored by its time."""
        return f"{self.prefix}live:index"

    @property
    def live_version(self) -> str:
        """Hash: vehicle -> version of its stored live state (a replay never writes an older one)."""
        return f"{self.prefix}live:version"

    @property
    def positions_channel(self) -> str:
        return f"{self.prefix}live:positions"

    @property
    def alerts_channel(self) -> str:
        return f"{self.prefix}live:alerts"

    def alert(self, alert_id: str) -> str:
        return f"{self.prefix}alert:{alert_id}"

    @property
    def alerts_by_ts(self) -> str:
        return f"{self.prefix}alerts:by_ts"

    def alerts_vehicle(self, vehicle_id: str) -> str:
        return f"{self.prefix}alerts:vehicle:{vehicle_id}"

    def alerts_type(self, alert_type: str) -> str:
        return f"{self.prefix}alerts:type:{alert_type}"

    def alerts_open(self, vehicle_id: str) -> str:
        return f"{self.prefix}alerts:open:{vehicle_id}"

    @property
    def heard(self) -> str:
        """Hash: vehicle -> how the device edge last heard it (JSON: protocol, at_ms, replica),
        written by the edge every 30 s per vehicle, at once when its protocol changes
        (`fleetfence.heard`)."""
        return f"{self.prefix}heard"

    def heard_by(self, protocol: str) -> str:
        """Sorted set: the vehicles whose last protocol was `protocol`, scored by when (ms)."""
        return f"{self.prefix}heard:by:{protocol}"

    def service(self, kind: str, instance: str) -> str:
        """A running service's announcement (JSON, with a TTL its heartbeat refreshes)."""
        return f"{self.prefix}services:{kind}:{instance}"

    @property
    def services_pattern(self) -> str:
        """SCAN MATCH pattern of every service announcement (the prefix's glob characters escaped)."""
        return _GLOB_SPECIAL.sub(r"\\\1", self.prefix) + "services:*"
