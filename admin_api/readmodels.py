"""Key names of the Redis read models (docs/contracts.md, "Redis read models").

The processor and the alert history receiver write these; the API only reads them.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis.asyncio as aioredis


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


# One vehicle's live state and its open alerts in one round trip. The GET + HVALS pipeline and the
# MGET of the alerts that followed it were two round trips and three commands through redis-py's
# asyncio client, whose per-command Python cost dominated this endpoint (bench/api.py).
LIVE_ONE_LUA = """
local state = redis.call('GET', KEYS[1])
if not state then return {} end
local out = {state}
for _, id in ipairs(redis.call('HVALS', KEYS[2])) do
  local alert = redis.call('GET', ARGV[1] .. id)
  if alert then out[#out + 1] = alert end
end
return out
"""


class LiveReader:
    """Reads one vehicle's live read model (state + open alerts) with LIVE_ONE_LUA."""

    def __init__(self, r: aioredis.Redis, keys: ReadKeys) -> None:
        self.keys = keys
        self._script = r.register_script(LIVE_ONE_LUA)

    async def one(self, vehicle_id: str) -> tuple[bytes | None, list[bytes]]:
        """The stored state JSON (None when there is none) and the open alerts' JSON."""
        k = self.keys
        reply = await self._script([k.live(vehicle_id), k.alerts_open(vehicle_id)], [k.alert("")])
        if not reply:
            return None, []
        return reply[0], list(reply[1:])
