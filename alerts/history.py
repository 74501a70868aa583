"""The alert history receiver: the Redis read models the admin API reads (docs/contracts.md).

All writes for one alert happen in one Lua script, which Redis runs atomically: `SET NX` of
`ff:alert:{id}` decides whether the alert is new, and only a new alert is indexed, changes the open
conditions and is published on `ff:live:alerts`. A replay after a crash therefore changes nothing
and publishes nothing twice, without a separate de-duplication store.
"""

from __future__ import annotations

import logging
import time

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


# KEYS: by_ts. ARGV: the alert, vehicle index, type index and open-hash key prefixes, the cutoff
# (ms, exclusive), the most alerts to look at. Each alert before the cutoff leaves the indexes; its
# document goes too, unless it is one of its vehicle's open conditions, which the API shows with the
# vehicle's live state: that document stays (one per open condition: still bounded).
_TRIM = """
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[5], 'LIMIT', 0, tonumber(ARGV[6]))
local removed = 0
for _, id in ipairs(ids) do
  local doc = redis.call('GET', ARGV[1] .. id)
  local keep = false
  if doc then
    local ok, a = pcall(cjson.decode, doc)
    if ok and type(a) == 'table' then
      if type(a['vehicle_id']) == 'string' then
        redis.call('ZREM', ARGV[2] .. a['vehicle_id'], id)
        for _, open_id in ipairs(redis.call('HVALS', ARGV[4] .. a['vehicle_id'])) do
          if open_id == id then keep = true end
        end
      end
      if type(a['type']) == 'string' then redis.call('ZREM', ARGV[3] .. a['type'], id) end
    end
    if not keep then
      redis.call('DEL', ARGV[1] .. id)
      removed = removed + 1
    end
  end
  redis.call('ZREM', KEYS[1], id)
end
return {#ids, removed}
"""

# A trim looks at most this many alerts (one short Lua call: Redis serves nothing else meanwhile),
# at most once per TRIM_INTERVAL_S: 100 alerts a second, far above a fleet's alert rate.
TRIM_BATCH = 1000
TRIM_INTERVAL_S = 10.0


class HistorySink:
    """`retention_ms`: alerts older than this by event time leave the read model (`trim`), checked
    as alerts are delivered; None keeps every alert (Redis then grows with the alerts)."""

    idempotent = True

    def __init__(
        self,
        client: redis.Redis,
        prefix: str,
        retention_ms: int | None = None,
        trim_interval_s: float = TRIM_INTERVAL_S,
    ) -> None:
        self._r = client
        self.keys = ReadKeys(prefix)
        self._script = client.register_script(_SCRIPT)
        self._trim = client.register_script(_TRIM)
        self.retention_ms = retention_ms
        self.trim_interval_s = trim_interval_s
        self._next_trim_s = time.monotonic() + trim_interval_s

    def trim(self, now_ms: int, batch: int = TRIM_BATCH) -> tuple[int, int]:
        """Take the alerts older than the retention out of the read model, at most `batch` of
        them: (alerts taken out of the indexes, documents deleted)."""
        if self.retention_ms is None:
            return 0, 0
        k = self.keys
        seen, removed = self._trim(
            keys=[k.alerts_by_ts],
            args=[
                k.alert(""),
                k.alerts_vehicle(""),
                k.alerts_type(""),
                k.alerts_open(""),
                now_ms - self.retention_ms,
                batch,
            ],
        )
        if seen:
            logger.info("alert history trimmed alerts=%d documents_deleted=%d", seen, removed)
        return int(seen), int(removed)

    def _maybe_trim(self) -> None:
        now_s = time.monotonic()
        if self.retention_ms is None or now_s < self._next_trim_s:
            return
        self._next_trim_s = now_s + self.trim_interval_s
        self.trim(int(time.time() * 1000))

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
        self._maybe_trim()
        return Outcome.DELIVERED if int(created) == 1 else Outcome.DUPLICATE

    def close(self) -> None:
        self._r.close()
