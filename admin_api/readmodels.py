"""Key names of the Redis read models (docs/contracts.md, "Redis read models").

The processor and the alert history receiver write these; the API only reads them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReadKeys:
    prefix: str

    def live(self, vehicle_id: str) -> str:
        return f"{self.prefix}live:{vehicle_id}"

    @property
    def live_index(self) -> str:
        return f"{self.prefix}live:index"

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
