"""The API's reads of the Redis read models (the key names: `fleetfence.readmodels`).

The processor and the alert history receiver write them; the API only reads them.
"""

from __future__ import annotations

import orjson
import redis.asyncio as aioredis

from fleetfence.readmodels import ReadKeys

# One vehicle's live state and its open alerts in one round trip. A GET + HVALS pipeline and then an
# MGET of the alerts would be two round trips and three commands through redis-py's asyncio client,
# whose per-command Python cost would dominate this endpoint.
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


async def last_fix_ms(r: aioredis.Redis, keys: ReadKeys, vehicle_id: str) -> int | None:
    """Event time of the newest fix the processor applied for the vehicle (None: none yet)."""
    raw = await r.get(keys.live(vehicle_id))
    if not raw:
        return None
    ts = orjson.loads(raw).get("ts_ms")
    return int(ts) if isinstance(ts, int) else None
