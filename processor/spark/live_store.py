"""The live read model's writer: a micro-batch's live states into Redis, newest state wins.

Runs in the sink's executors (`processor.spark.kafka_sink.AlertStreamWriter.write`), outside the Kafka
transaction: the read model is idempotent instead (a state only replaces an older one), so a retried
or replayed batch writes the same or an older state and changes nothing. Key names come from
`fleetfence.readmodels.ReadKeys`, which the API and the receivers read through.
"""

from __future__ import annotations

import redis

from fleetfence.readmodels import ReadKeys

# Replaces each live state only when (seq, silent) is newer: replays and retries write the same or
# an older state and change nothing. Many vehicles per call, versions in a hash beside the states,
# so Redis compares two numbers instead of decoding the stored JSON (a state written before the
# version hash existed is still judged by its JSON). KEYS: index, versions, then one state key per
# vehicle; ARGV: per vehicle (id, version, ts_ms, state).
LIVE_LUA = """
local written = 0
for i = 3, #KEYS do
  local a = (i - 3) * 4
  local vid, newv = ARGV[a + 1], tonumber(ARGV[a + 2])
  local curv = tonumber(redis.call('HGET', KEYS[2], vid))
  if not curv then
    local cur = redis.call('GET', KEYS[i])
    if cur then
      local ok, d = pcall(cjson.decode, cur)
      if ok and d['seq'] then
        curv = tonumber(d['seq']) * 2 + ((d['silent'] == true) and 1 or 0)
      end
    end
  end
  if not curv or curv < newv then
    redis.call('SET', KEYS[i], ARGV[a + 4])
    redis.call('HSET', KEYS[2], vid, newv)
    redis.call('ZADD', KEYS[1], ARGV[a + 3], vid)
    written = written + 1
  end
end
return written
"""
LIVE_PER_CALL = 500  # vehicles per script call: one call keeps Redis busy for about a millisecond


def write_live(redis_url: str, keys: ReadKeys, live: list[tuple[str, int, int, bytes]]) -> int:
    """Write (vehicle_id, version, ts_ms, state JSON) items; return how many replaced a state.
    Publishes the batch's states on the positions channel once, for the live map."""
    r = redis.Redis.from_url(redis_url)
    try:
        script = r.register_script(LIVE_LUA)
        pipe = r.pipeline(transaction=False)
        head = [keys.live_index, keys.live_version]
        for i in range(0, len(live), LIVE_PER_CALL):
            part = live[i : i + LIVE_PER_CALL]
            script(
                keys=head + [keys.live(vid) for vid, *_ in part],
                args=[x for item in part for x in item],
                client=pipe,
            )
        written = sum(int(x) for x in pipe.execute())
        # One message per task and batch, not per vehicle: the live map redraws in batches.
        r.publish(keys.positions_channel, b"[" + b",".join(v for *_, v in live) + b"]")
        return written
    finally:
        r.close()
