"""The alert history receiver: the Redis read models the admin API reads (docs/contracts.md).

All writes for one alert happen in one Lua script, which Redis runs atomically: `SET NX` of
`ff:alert:{id}` decides whether the alert is new, and only a new alert is indexed, changes the open
conditions and is published on `ff:live:alerts`. A replay after a crash therefore changes nothing
and publishes nothing twice, without a separate de-duplication store.
"""

from __future__ import annotations

import logging

import redis

from alerts.model import Alert, condition_change
from alerts.sink import Context, Outcome
from fleetfence.readmodels import ReadKeys

logger = logging.getLogger(__name__)

# KEYS: alert, by_ts, by_vehicle, by_type, open hash, channel
# ARGV: alert_id, ts_ms, raw json, seq, open field or "", n closes, close fields...
# An open field is only replaced, and a close only applied, when the stored alert is not newer
# (by seq) than this one, so a late or replayed alert cannot reopen or close the wrong condition.
_SCRIPT = """
if not redis.call('SET', KEYS[1], ARGV[3], 'NX') then return 0 end
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[2], ARGV[1])
redis.call('ZADD', KEYS[4], ARGV[2], ARGV[1])
local seq = tonumber(ARGV[4])
local prefix = string.sub(KEYS[1], 1, string.len(KEYS[1]) - string.len(ARGV[1]))
local function stored_seq(field)
  local id = redis.call('HGET', KEYS[5], field)
  if not id then return nil end
  local doc = redis.call('GET', prefix .. id)
  if not doc then return -1 end
  local ok, parsed = pcall(cjson.decode, doc)
  if not ok or type(parsed['seq']) ~= 'number' then return -1 end
  return parsed['seq']
end
local n = tonumber(ARGV[6])
for i = 1, n do
  local field = ARGV[6 + i]
  local s = stored_seq(field)
  if s ~= nil and s <= seq then redis.call('HDEL', KEYS[5], field) end
end
if ARGV[5] ~= '' then
  local s = stored_seq(ARGV[5])
  if s == nil or s <= seq then redis.call('HSET', KEYS[5], ARGV[5], ARGV[1]) end
end
redis.call('PUBLISH', KEYS[6], ARGV[3])
return 1
"""


class HistorySink:
    idempotent = True

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self._r = client
        self.keys = ReadKeys(prefix)
        self._script = client.register_script(_SCRIPT)

    def deliver(self, alert: Alert, ctx: Context) -> Outcome:
        k = self.keys
        change = condition_change(alert)
        created = self._script(
            keys=[
                k.alert(alert.alert_id),
                k.alerts_by_ts,
                k.alerts_vehicle(alert.vehicle_id),
                k.alerts_type(alert.type.value),
                k.alerts_open(alert.vehicle_id),
                k.alerts_channel,
            ],
            args=[
                alert.alert_id,
                alert.ts_ms,
                alert.raw,
                alert.seq,
                change.opens or "",
                len(change.closes),
                *change.closes,
            ],
        )
        return Outcome.DELIVERED if int(created) == 1 else Outcome.DUPLICATE

    def close(self) -> None:
        self._r.close()
