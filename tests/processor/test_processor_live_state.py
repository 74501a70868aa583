"""The processor's live read model writer against a real Redis: only a newer (seq, silent) state
replaces a stored one, across script calls and for states written before the version hash."""

from __future__ import annotations

import orjson
import redis

from fleetfence.settings import Settings
from processor.kafka_sink import AlertStreamWriter
from processor.live_store import LIVE_PER_CALL
from processor.rows import pack_live, unpack_live


def state(vid: str, seq: int, silent: bool = False) -> dict[str, object]:
    return {"vehicle_id": vid, "seq": seq, "ts_ms": 1_795_000_000_000 + seq, "silent": silent, "lat": 1.0}


def writer(s: Settings, prefix: str) -> AlertStreamWriter:
    opts = {"bootstrap": "unused", "alertstopic": "a", "dlqtopic": "d", "markerstopic": "m", "sinkid": "x"}
    return AlertStreamWriter({**opts, "redisurl": s.redis_dsn, "redisprefix": prefix})


def test_only_newer_states_replace_and_counts_are_exact(settings: Settings) -> None:
    prefix = f"{settings.redis_prefix}livetest:"
    r = redis.Redis.from_url(settings.redis_dsn)
    w = writer(settings, prefix)
    n = LIVE_PER_CALL * 2 + 7  # several script calls in one pipeline
    first = [state(f"v{i}", 10) for i in range(n)]
    assert w._write_live(unpack_live(pack_live(first))) == n
    # Replayed batch: nothing written. Mixed batch: older, equal, silent-at-same-seq, newer.
    assert w._write_live(unpack_live(pack_live(first))) == 0
    mixed = [state("v0", 9), state("v1", 10), state("v2", 10, silent=True), state("v3", 11)]
    assert w._write_live(unpack_live(pack_live(mixed))) == 2
    got = {v: orjson.loads(r.get(f"{prefix}live:{v}") or b"{}") for v in ("v0", "v1", "v2", "v3")}
    assert [(g["seq"], g["silent"]) for g in got.values()] == [
        (10, False),
        (10, False),
        (10, True),
        (11, False),
    ]
    assert r.zcard(f"{prefix}live:index") == n
    assert r.zscore(f"{prefix}live:index", "v3") == 1_795_000_000_011
    assert int(r.hget(f"{prefix}live:version", "v2") or 0) == 21


def test_state_written_before_the_version_hash_is_judged_by_its_json(settings: Settings) -> None:
    prefix = f"{settings.redis_prefix}livelegacy:"
    r = redis.Redis.from_url(settings.redis_dsn)
    r.set(f"{prefix}live:old", orjson.dumps(state("old", 50)))
    w = writer(settings, prefix)
    assert w._write_live(unpack_live(pack_live([state("old", 49)]))) == 0
    assert orjson.loads(r.get(f"{prefix}live:old") or b"{}")["seq"] == 50
    assert w._write_live(unpack_live(pack_live([state("old", 51)]))) == 1
    assert orjson.loads(r.get(f"{prefix}live:old") or b"{}")["seq"] == 51
