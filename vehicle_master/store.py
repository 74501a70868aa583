"""The vehicle master in Redis: versioned entities written together with their change event.

Every write is one Lua script, so Redis runs it atomically (like a MULTI/EXEC, but the checks
happen inside the transaction, with no WATCH retry loop): it checks the expected version
(optimistic concurrency), checks references, writes the entity hash, bumps its version and appends
the `fleet.master` change event to the outbox stream. Either both the entity and its event exist or
neither does, which is what lets the relay (vehicle_master.relay) promise that no change is lost.

Deleted entities keep a tombstone with their version, so re-creating one continues its version
sequence and consumers that drop events with an already-applied version stay correct.

Key layout under the Redis prefix P (single Redis; keys are built inside the script, so this is
not Redis Cluster-safe, which FleetFence's one-node Redis does not need):

    P master:{entity}:{id}        hash  version, data (wire JSON), deleted (0/1), updated_ms
    P master:{entity}:index       zset  ids of live entities, score 0 (lexicographic paging)
    P master:route_refs:{route}   set   vehicle ids assigned to the route (blocks its deletion)
    P master:outbox               stream  key, event (the exact `fleet.master` JSON)

`VehicleMaster` (sync, for the simulator, the CLI and tests) and `AsyncVehicleMaster` (for the
API) are thin shells over the same pure helpers below.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import orjson
import redis
import redis.asyncio as aioredis
from prometheus_client import Counter
from pydantic import ValidationError

from fleetfence.contracts import MasterEntity, utc_now_ms
from fleetfence.settings import Settings
from vehicle_master.errors import (
    AlreadyExistsError,
    InUseError,
    MasterError,
    MasterValidationError,
    NotFoundError,
    UnknownReferenceError,
    VersionConflictError,
)
from vehicle_master.models import DATA_MODELS, AssignmentData, EntityData, entity_id, entity_of, to_wire

logger = logging.getLogger(__name__)

WRITES = Counter(
    "fleetfence_master_writes_total", "Vehicle-master writes by entity and outcome", ["entity", "outcome"]
)

WriteMode = Literal["create", "upsert", "update", "delete"]

WRITE_LUA = """
local ekey, index, outbox = KEYS[1], KEYS[2], KEYS[3]
local entity, id, mode, expected = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local data, ts, prefix = ARGV[5], ARGV[6], ARGV[7]
local cur = redis.call('HMGET', ekey, 'version', 'deleted', 'data')
local version = tonumber(cur[1]) or 0
local exists = version > 0 and cur[2] ~= '1'
local function live(key)
  local h = redis.call('HMGET', key, 'version', 'deleted')
  return h[1] and h[2] ~= '1'
end
if mode == 'create' and exists then return {'exists', version} end
if (mode == 'update' or mode == 'delete') and not exists then return {'not_found', version} end
if expected ~= '' and ((not exists) or tonumber(expected) ~= version) then return {'conflict', version} end
local op = 'upsert'
if mode == 'delete' then
  op = 'delete'
  data = cur[3]
  if entity == 'route' and redis.call('SCARD', prefix .. 'master:route_refs:' .. id) > 0 then
    return {'in_use', version}
  end
  if entity == 'vehicle' and live(prefix .. 'master:assignment:' .. id) then return {'in_use', version} end
else
  if entity == 'assignment' then
    if not live(prefix .. 'master:vehicle:' .. ARGV[8]) then return {'unknown_vehicle', version} end
    if not live(prefix .. 'master:route:' .. ARGV[9]) then return {'unknown_route', version} end
  end
  if exists and cur[3] == data then return {'unchanged', version} end
end
if entity == 'assignment' then
  if exists then
    local old = cjson.decode(cur[3])
    redis.call('SREM', prefix .. 'master:route_refs:' .. old['route_id'], id)
  end
  if op == 'upsert' then redis.call('SADD', prefix .. 'master:route_refs:' .. ARGV[9], id) end
end
local v = version + 1
if op == 'delete' then
  redis.call('HSET', ekey, 'version', v, 'deleted', '1', 'updated_ms', ts)
  redis.call('ZREM', index, id)
else
  redis.call('HSET', ekey, 'version', v, 'deleted', '0', 'data', data, 'updated_ms', ts)
  redis.call('ZADD', index, 0, id)
end
local event = '{"entity":"' .. entity .. '","id":' .. cjson.encode(id) .. ',"version":' .. v ..
  ',"op":"' .. op .. '","ts_ms":' .. ts .. ',"data":' .. data .. '}'
local sid = redis.call('XADD', outbox, '*', 'key', entity .. ':' .. id, 'event', event)
local created = 0
if not exists then created = 1 end
return {'ok', v, sid, created}
"""


@dataclass(frozen=True)
class MasterKeys:
    """Redis key names under one prefix (tests use a unique prefix each)."""

    prefix: str

    def entity(self, entity: str, entity_id: str) -> str:
        return f"{self.prefix}master:{entity}:{entity_id}"

    def index(self, entity: str) -> str:
        return f"{self.prefix}master:{entity}:index"

    @property
    def outbox(self) -> str:
        return f"{self.prefix}master:outbox"

    @property
    def relay_acked(self) -> str:
        return f"{self.prefix}master:relay:acked"

    @property
    def relay_lock(self) -> str:
        return f"{self.prefix}master:relay:lock"


@dataclass(frozen=True)
class MasterRecord:
    entity: MasterEntity
    id: str
    version: int
    data: dict[str, Any]
    updated_ms: int


@dataclass(frozen=True)
class WriteResult:
    entity: MasterEntity
    id: str
    version: int
    op: Literal["upsert", "delete", "none"]
    created: bool
    stream_id: str | None

    @property
    def changed(self) -> bool:
        return self.op != "none"


def canonical_json(data: dict[str, Any]) -> str:
    """Sorted keys, so an unchanged entity serialises to the same bytes and is not re-versioned."""
    return orjson.dumps(data, option=orjson.OPT_SORT_KEYS).decode()


def parse_entity(entity: MasterEntity | str, raw: Any) -> EntityData:
    """Validate a plain dict into its entity model; errors become one MasterValidationError."""
    model = DATA_MODELS[MasterEntity(entity)]
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = tuple(first["loc"])
        msg = first["msg"].removeprefix("Value error, ")
        raise MasterValidationError(f"{entity}: {'.'.join(map(str, loc)) or 'body'}: {msg}", loc) from exc


def write_call(
    keys: MasterKeys,
    *,
    entity: MasterEntity,
    eid: str,
    mode: WriteMode,
    data_json: str,
    if_version: int | None,
    now_ms: int,
    refs: tuple[str, str] = ("", ""),
) -> tuple[list[str], list[str]]:
    """KEYS and ARGV of the write script."""
    return (
        [keys.entity(entity, eid), keys.index(entity), keys.outbox],
        [
            entity.value,
            eid,
            mode,
            "" if if_version is None else str(if_version),
            data_json,
            str(now_ms),
            keys.prefix,
            refs[0],
            refs[1],
        ],
    )


def interpret(entity: MasterEntity, eid: str, raw: list[Any], deleting: bool) -> WriteResult:
    """Turn the script's reply into a WriteResult or the matching MasterError."""
    code = raw[0].decode() if isinstance(raw[0], bytes) else str(raw[0])
    version = int(raw[1])
    WRITES.labels(entity.value, code).inc()
    what = f"{entity.value} {eid!r}"
    if code == "ok":
        sid = raw[2].decode() if isinstance(raw[2], bytes) else str(raw[2])
        op: Literal["upsert", "delete"] = "delete" if deleting else "upsert"
        return WriteResult(entity, eid, version, op, bool(int(raw[3])), sid)
    if code == "unchanged":
        return WriteResult(entity, eid, version, "none", False, None)
    if code == "exists":
        raise AlreadyExistsError(f"{what} already exists (version {version})")
    if code == "not_found":
        raise NotFoundError(f"{what} does not exist")
    if code == "conflict":
        raise VersionConflictError(f"{what} is at version {version}, not the expected one", version)
    if code == "unknown_vehicle":
        raise UnknownReferenceError(f"{what}: unknown vehicle {eid!r}", ("vehicle_id",))
    if code == "unknown_route":
        raise UnknownReferenceError(f"{what}: the assigned route does not exist", ("route_id",))
    if code == "in_use":
        raise InUseError(f"{what} is still referenced by an assignment; delete the assignment first")
    raise MasterError(f"unexpected reply from the write script: {raw!r}")  # a bug, not bad input


def prepare(data: EntityData) -> tuple[MasterEntity, str, str, tuple[str, str]]:
    entity = entity_of(data)
    refs = (data.vehicle_id, data.route_id) if isinstance(data, AssignmentData) else ("", "")
    return entity, entity_id(data), canonical_json(to_wire(data)), refs


def decode_record(entity: MasterEntity, eid: str, fields: list[Any]) -> MasterRecord | None:
    """HMGET version, deleted, data, updated_ms -> a record, or None when missing or deleted."""
    version, deleted, data, updated = (f.decode() if isinstance(f, bytes) else f for f in fields)
    if version is None or deleted == "1" or data is None:
        return None
    return MasterRecord(entity, eid, int(version), orjson.loads(data), int(updated or 0))


RECORD_FIELDS = ("version", "deleted", "data", "updated_ms")
Filter = Callable[[dict[str, Any]], bool]

# One page of a list in one round trip: the ids after a cursor and each one's record fields.
# A ZRANGE followed by a pipeline of HMGETs costs two round trips and, in redis-py's asyncio
# client, Python work per pipelined command that grows with the page; one script is one command.
# Entity keys are built here like MasterKeys.entity builds them.
LIST_LUA = """
local ids = redis.call('ZRANGE', KEYS[1], ARGV[2], '+', 'BYLEX', 'LIMIT', 0, tonumber(ARGV[3]))
local out = {}
for _, id in ipairs(ids) do
  local f = redis.call('HMGET', ARGV[1] .. id, 'version', 'deleted', 'data', 'updated_ms')
  out[#out + 1] = id
  for j = 1, 4 do out[#out + 1] = f[j] end
end
return out
"""


def _lex_start(after: str | None) -> str:
    return "-" if not after else f"({after}"


def list_call(
    keys: MasterKeys, ent: MasterEntity, cursor: str | None, num: int
) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of LIST_LUA for up to `num` ids after `cursor`."""
    return [keys.index(ent)], [keys.entity(ent, ""), _lex_start(cursor), num]


def collect_page(
    ent: MasterEntity, reply: list[Any], out: list[MasterRecord], limit: int, where: Filter | None
) -> str | None:
    """Append LIST_LUA's live, matching records to `out` (up to `limit`); the last id scanned."""
    last: str | None = None
    for k in range(0, len(reply), 5):
        raw = reply[k]
        last = raw.decode() if isinstance(raw, bytes) else str(raw)
        rec = decode_record(ent, last, reply[k + 1 : k + 5])
        if rec is not None and (where is None or where(rec.data)) and len(out) < limit:
            out.append(rec)
    return last


def page_size(limit: int, where: Filter | None) -> int:
    """Ids fetched per round: a filter may drop many, so fetch at least 100 at a time then."""
    return limit if where is None else max(limit, 100)


class VehicleMaster:
    """Synchronous vehicle master, for the simulator, the CLI and tests.

    >>> vm = VehicleMaster.from_settings(settings)
    >>> vm.upsert(VehicleData(vehicle_id="truck-1", label="Truck 1"))
    """

    def __init__(self, client: redis.Redis, prefix: str, clock_ms: Callable[[], int] = utc_now_ms) -> None:
        self.r = client
        self.keys = MasterKeys(prefix)
        self.clock_ms = clock_ms
        self._script = client.register_script(WRITE_LUA)
        self._list_script = client.register_script(LIST_LUA)

    @classmethod
    def from_settings(cls, settings: Settings) -> VehicleMaster:
        return cls(redis.Redis.from_url(settings.redis_dsn), settings.redis_prefix)

    def close(self) -> None:
        self.r.close()

    def _write(self, data: EntityData, mode: WriteMode, if_version: int | None) -> WriteResult:
        entity, eid, js, refs = prepare(data)
        keys, args = write_call(
            self.keys,
            entity=entity,
            eid=eid,
            mode=mode,
            data_json=js,
            if_version=if_version,
            now_ms=self.clock_ms(),
            refs=refs,
        )
        return interpret(entity, eid, self._script(keys, args), deleting=False)

    def create(self, data: EntityData) -> WriteResult:
        """Create; AlreadyExistsError if it exists."""
        return self._write(data, "create", None)

    def upsert(self, data: EntityData, *, if_version: int | None = None) -> WriteResult:
        """Create or replace; an identical entity is left alone (no new version, no event)."""
        return self._write(data, "upsert", if_version)

    def update(self, data: EntityData, *, if_version: int | None = None) -> WriteResult:
        """Replace an existing entity; NotFoundError if missing."""
        return self._write(data, "update", if_version)

    def delete(self, entity: MasterEntity | str, eid: str, *, if_version: int | None = None) -> WriteResult:
        ent = MasterEntity(entity)
        keys, args = write_call(
            self.keys,
            entity=ent,
            eid=eid,
            mode="delete",
            data_json="",
            if_version=if_version,
            now_ms=self.clock_ms(),
        )
        return interpret(ent, eid, self._script(keys, args), deleting=True)

    def upsert_many(self, items: Iterable[EntityData]) -> list[WriteResult]:
        """Each item is its own atomic write+event; order is kept (routes before assignments)."""
        return [self.upsert(i) for i in items]

    def get(self, entity: MasterEntity | str, eid: str) -> MasterRecord:
        ent = MasterEntity(entity)
        rec = decode_record(ent, eid, self.r.hmget(self.keys.entity(ent, eid), RECORD_FIELDS))
        if rec is None:
            raise NotFoundError(f"{ent.value} {eid!r} does not exist")
        return rec

    def list(
        self,
        entity: MasterEntity | str,
        *,
        after: str | None = None,
        limit: int = 100,
        where: Filter | None = None,
    ) -> list[MasterRecord]:
        """Up to `limit` live entities ordered by id, starting after the id `after`."""
        ent = MasterEntity(entity)
        out: list[MasterRecord] = []
        cursor, num = after, page_size(limit, where)
        while len(out) < limit:
            keys, args = list_call(self.keys, ent, cursor, num)
            reply = self._list_script(keys, args)
            cursor = collect_page(ent, reply, out, limit, where)
            if len(reply) < 5 * num:  # the index ended
                break
        return out

    def scan(
        self, entity: MasterEntity | str, *, after: str | None = None, page: int = 1000
    ) -> Iterator[MasterRecord]:
        """Every live entity ordered by id, from after the id `after`, fetched a page at a time
        (a caller that stops early, e.g. past an id prefix, reads no further page)."""
        cursor = after
        while recs := self.list(entity, after=cursor, limit=page):
            yield from recs
            if len(recs) < page:
                return
            cursor = recs[-1].id


class AsyncVehicleMaster:
    """The same store over redis.asyncio, for the admin API's event loop."""

    def __init__(self, client: aioredis.Redis, prefix: str, clock_ms: Callable[[], int] = utc_now_ms) -> None:
        self.r = client
        self.keys = MasterKeys(prefix)
        self.clock_ms = clock_ms
        self._script = client.register_script(WRITE_LUA)
        self._list_script = client.register_script(LIST_LUA)

    async def _write(self, data: EntityData, mode: WriteMode, if_version: int | None) -> WriteResult:
        entity, eid, js, refs = prepare(data)
        keys, args = write_call(
            self.keys,
            entity=entity,
            eid=eid,
            mode=mode,
            data_json=js,
            if_version=if_version,
            now_ms=self.clock_ms(),
            refs=refs,
        )
        return interpret(entity, eid, await self._script(keys, args), deleting=False)

    async def create(self, data: EntityData) -> WriteResult:
        return await self._write(data, "create", None)

    async def upsert(self, data: EntityData, *, if_version: int | None = None) -> WriteResult:
        return await self._write(data, "upsert", if_version)

    async def update(self, data: EntityData, *, if_version: int | None = None) -> WriteResult:
        return await self._write(data, "update", if_version)

    async def delete(
        self, entity: MasterEntity | str, eid: str, *, if_version: int | None = None
    ) -> WriteResult:
        ent = MasterEntity(entity)
        keys, args = write_call(
            self.keys,
            entity=ent,
            eid=eid,
            mode="delete",
            data_json="",
            if_version=if_version,
            now_ms=self.clock_ms(),
        )
        return interpret(ent, eid, await self._script(keys, args), deleting=True)

    async def get(self, entity: MasterEntity | str, eid: str) -> MasterRecord:
        ent = MasterEntity(entity)
        rec = decode_record(ent, eid, await self.r.hmget(self.keys.entity(ent, eid), RECORD_FIELDS))
        if rec is None:
            raise NotFoundError(f"{ent.value} {eid!r} does not exist")
        return rec

    async def list(
        self,
        entity: MasterEntity | str,
        *,
        after: str | None = None,
        limit: int = 100,
        where: Filter | None = None,
    ) -> list[MasterRecord]:
        ent = MasterEntity(entity)
        out: list[MasterRecord] = []
        cursor, num = after, page_size(limit, where)
        while len(out) < limit:
            keys, args = list_call(self.keys, ent, cursor, num)
            reply = await self._list_script(keys, args)
            cursor = collect_page(ent, reply, out, limit, where)
            if len(reply) < 5 * num:  # the index ended
                break
        return out
