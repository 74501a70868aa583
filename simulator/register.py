"""Registering a scenario's routes, zones, vehicles and assignments in the vehicle master.

Two doors, same entities: `VehicleMaster` straight into Redis (default, in-process, with an
in-process outbox relay so the change events reach `fleet.master`), or the admin API's bulk
`/api/v1/import` over HTTP with an API key (its own relay publishes). Either way the simulator
then waits until `fleet.master` has grown by the number of changed entities, because fixes the
processor reads before their assignment would be "unassigned" and the ground truth wrong.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from itertools import takewhile
from typing import TYPE_CHECKING, Any

import redis

from fleetfence.contracts import MasterEntity
from fleetfence.errors import InfraError
from fleetfence.rules import GROUP_ATTRIBUTE
from fleetfence.settings import Settings
from simulator.errors import RegistrationError
from simulator.scenario import Scenario
from vehicle_master.models import AssignmentData, EntityData, RouteData, VehicleData, ZoneData

if TYPE_CHECKING:
    from vehicle_master.store import VehicleMaster

logger = logging.getLogger(__name__)

IMPORT_CHUNK = 5000  # features per /import request: well under the API's 5 MiB body limit


@dataclass
class RegistrationReport:
    entities: int
    changed: int
    seconds: float
    via: str


def scenario_entities(sc: Scenario) -> list[EntityData]:
    """Routes, zones, vehicles, then assignments (references before what refers to them)."""
    cfg = sc.cfg
    r = cfg.rules
    out: list[EntityData] = []
    for route in sc.city.routes:
        out.append(
            RouteData.model_validate(
                {
                    "route_id": route.route_id,
                    "name": route.name,
                    "geometry": {"type": "LineString", "coordinates": route.coords_lonlat},
                    **r.to_master(),
                }
            )
        )
    for z in sc.city.zones:
        out.append(
            ZoneData.model_validate(
                {
                    "zone_id": z.zone_id,
                    "name": z.name,
                    "kind": z.kind,
                    "planned_stop": z.planned_stop,
                    "geometry": z.geometry(),
                }
            )
        )
    for vid, group in zip(sc.vehicle_ids(), sc.vehicle_groups(), strict=True):
        attributes = {"source": "simulator", GROUP_ATTRIBUTE: group}
        out.append(VehicleData(vehicle_id=vid, label=f"simulated {vid}", attributes=attributes))
    out.extend(scenario_assignments(sc))
    return out


def scenario_assignments(sc: Scenario) -> list[AssignmentData]:
    """Each vehicle's assignment to its route, valid from an hour before the first fix, with the
    planned arrival of a scheduled trip (absolute: it moves with the scenario's clock)."""
    valid_from = max(sc.cfg.start_ms - 3_600_000, 0)
    out: list[AssignmentData] = []
    for i, vid in enumerate(sc.vehicle_ids()):
        route_id = sc.city.routes[int(sc.route_idx[i])].route_id
        planned = int(sc.planned_arrival_ms[i])
        out.append(
            AssignmentData(
                vehicle_id=vid,
                route_id=route_id,
                valid_from_ms=valid_from,
                valid_to_ms=None,
                planned_arrival_ms=planned if planned >= 0 else None,
            )
        )
    return out


def moved_schedules(registered: Scenario, moved: Scenario) -> list[AssignmentData]:
    """The assignments to register again when `registered`'s fleet publishes on `moved`'s clock:
    those whose planned arrival moved with it.

    A real-time run registers first and fixes its clock once publishing can start (after the
    registration and the vehicles' credentials): every event time moves by that delay, and so do
    the ground truth's planned arrivals. The processor judges a scheduled trip against the arrival
    in the vehicle master, so an arrival left where it was registered is that delay earlier than
    the truth's, and ARRIVAL_BACK_ON_TIME comes as many seconds later as the set-up took.
    """
    before = {a.vehicle_id: a.planned_arrival_ms for a in scenario_assignments(registered)}
    return [a for a in scenario_assignments(moved) if a.planned_arrival_ms != before.get(a.vehicle_id)]


def master_end_offset(settings: Settings) -> int:
    from fleetfence.kafka import plain_consumer, watermarks

    c = plain_consumer(settings.bootstrap_servers, "fleetfence-sim-probe")
    try:
        return watermarks(c, settings.topics.master, 0)[1]
    finally:
        c.close()


def wait_master_published(settings: Settings, target_offset: int, timeout_s: float) -> None:
    """Wait until `fleet.master` ends at or beyond `target_offset` (the relay published ours)."""
    deadline = time.monotonic() + timeout_s
    while (end := master_end_offset(settings)) < target_offset:
        if time.monotonic() > deadline:
            raise InfraError(
                f"fleet.master reached offset {end}, not {target_offset}, within {timeout_s}s: "
                "is an outbox relay running (the admin API's, or `fleetfence master-relay`)?"
            )
        time.sleep(0.2)


def register_direct(
    settings: Settings,
    entities: list[EntityData],
    *,
    run_relay: bool = True,
    timeout_s: float = 60.0,
    progress: Callable[[int], None] | None = None,
) -> RegistrationReport:
    from vehicle_master.store import VehicleMaster

    t0 = time.monotonic()
    vm = VehicleMaster.from_settings(settings)
    changed = 0
    last_sid: tuple[int, int] = (0, 0)
    try:
        for e in entities:
            res = vm.upsert(e)
            if res.changed and res.stream_id:
                changed += 1
                last_sid = max(last_sid, _sid(res.stream_id))
            if progress is not None:
                progress(1)
    finally:
        vm.close()
    if changed:
        wait_relay_acked(settings, last_sid, run_relay=run_relay, timeout_s=timeout_s)
    return RegistrationReport(len(entities), changed, time.monotonic() - t0, "vehicle master")


def wait_relay_acked(
    settings: Settings, last_sid: tuple[int, int], *, run_relay: bool, timeout_s: float
) -> None:
    """Until the outbox relay has published every change event up to `last_sid` to fleet.master:
    whoever holds the relay lease (ours, started here when `run_relay`, or the admin API's) acks
    only after Kafka has it."""
    from vehicle_master.relay import OutboxRelay
    from vehicle_master.settings import MasterSettings
    from vehicle_master.store import MasterKeys

    relay = OutboxRelay(MasterSettings.from_base(settings)).start() if run_relay else None
    r = redis.Redis.from_url(settings.redis_dsn)
    acked_key = MasterKeys(settings.redis_prefix).relay_acked
    deadline = time.monotonic() + timeout_s
    try:
        while _sid(r.get(acked_key)) < last_sid:
            if time.monotonic() > deadline:
                raise InfraError(
                    f"the outbox relay did not publish the changes to fleet.master within {timeout_s}s"
                )
            time.sleep(0.05)
    finally:
        r.close()
        if relay is not None:
            relay.stop()


# Deleted in this order, so nothing is deleted while something still refers to it.
UNREGISTER_ORDER = (MasterEntity.ASSIGNMENT, MasterEntity.VEHICLE, MasterEntity.ZONE, MasterEntity.ROUTE)


def unregister_prefix(
    settings: Settings,
    prefix: str,
    *,
    api_url: str | None = None,
    api_key: str | None = None,
    run_relay: bool = True,
    timeout_s: float = 60.0,
) -> RegistrationReport:
    """Delete every assignment, vehicle, zone and route whose id starts with `prefix` (a scenario's
    `vehicle_prefix` names all four), as versioned deletes with their change events, revoke the
    vehicles' MQTT credentials, and wait until fleet.master has the deletes: a load test on a
    running installation leaves it as it found it. Through the admin API when given (as the
    registration was: deleting a vehicle there revokes its credentials), else straight in the
    vehicle master, the credentials revoked through its credential service."""
    from vehicle_master.store import VehicleMaster

    if not prefix:
        raise RegistrationError("an empty prefix would delete the whole vehicle master")
    t0 = time.monotonic()
    vm = VehicleMaster.from_settings(settings)
    try:
        ids = {ent: _ids_with_prefix(vm, ent, prefix) for ent in UNREGISTER_ORDER}
        found = sum(len(v) for v in ids.values())
        if api_url and api_key:
            before = master_end_offset(settings)
            deleted = _delete_api(ids, api_url, api_key)
            if deleted:
                wait_master_published(settings, before + deleted, timeout_s)
            return RegistrationReport(found, deleted, time.monotonic() - t0, f"admin API {api_url}")
        deleted = 0
        last_sid: tuple[int, int] = (0, 0)
        for ent in UNREGISTER_ORDER:
            for eid in ids[ent]:
                res = vm.delete(ent, eid)
                if res.changed and res.stream_id:
                    deleted += 1
                    last_sid = max(last_sid, _sid(res.stream_id))
    finally:
        vm.close()
    if settings.mqtt_auth and ids[MasterEntity.VEHICLE]:
        _revoke_direct(settings, ids[MasterEntity.VEHICLE])
    if deleted:
        wait_relay_acked(settings, last_sid, run_relay=run_relay, timeout_s=timeout_s)
    return RegistrationReport(found, deleted, time.monotonic() - t0, "vehicle master")


def _ids_with_prefix(vm: VehicleMaster, ent: MasterEntity, prefix: str) -> list[str]:
    """Ids are listed in order, and every id with the prefix sorts right after the prefix itself."""
    return [rec.id for rec in takewhile(lambda rec: rec.id.startswith(prefix), vm.scan(ent, after=prefix))]


# A DELETE that failed on the server's side (5xx) or on the way is sent again after these pauses
# (seconds): deleting is idempotent here (a 404 on the resend: it was deleted), and one Redis
# connection the API finds broken must not leave a load test's data in a running installation.
DELETE_RETRY_PAUSES_S = (0.5, 2.0, 5.0)


def _delete_api(ids: dict[MasterEntity, list[str]], api_url: str, api_key: str) -> int:
    deleted = 0
    for ent in UNREGISTER_ORDER:
        for eid in ids[ent]:
            deleted += _delete_one(f"{api_url.rstrip('/')}/api/v1/{ent.value}s/{eid}", api_key)
    return deleted


def _delete_one(url: str, api_key: str) -> int:
    """DELETE `url`: 1 when this call deleted it, 0 when it was gone (404)."""
    for pause in (*DELETE_RETRY_PAUSES_S, None):
        req = urllib.request.Request(url, method="DELETE", headers={"X-API-Key": api_key})
        try:
            with urllib.request.urlopen(req, timeout=30):
                return 1
        except urllib.error.HTTPError as exc:
            if exc.code == 404:  # gone meanwhile (or by an earlier attempt): nothing to do
                return 0
            if exc.code < 500 or pause is None:
                raise RegistrationError(f"admin API refused DELETE {url} ({exc.code})") from exc
            logger.warning("admin API answered DELETE %s with %s; sending it again", url, exc.code)
        except urllib.error.URLError as exc:
            if pause is None:
                raise RegistrationError(f"admin API unreachable for DELETE {url}: {exc.reason}") from exc
            logger.warning("admin API unreachable for DELETE %s (%s); sending it again", url, exc.reason)
        time.sleep(pause)  # a back-off before resending, not a wait for a condition
    raise AssertionError("unreachable: the last attempt returns or raises")


def _revoke_direct(settings: Settings, vehicle_ids: list[str]) -> None:
    from fleetfence.mqtt import DynSec
    from vehicle_master.credentials import VehicleCredentials

    r = redis.Redis.from_url(settings.redis_dsn)
    control = DynSec.from_settings(settings)
    try:
        creds = VehicleCredentials(r, settings.redis_prefix, control)
        for vid in vehicle_ids:
            creds.revoke(vid)
    finally:
        control.close()
        r.close()


def _sid(raw: bytes | str | None) -> tuple[int, int]:
    """A Redis stream id `ms-seq` as a comparable tuple (missing: before everything)."""
    if raw is None:
        return (0, 0)
    text = raw.decode() if isinstance(raw, bytes) else raw
    ms, _, n = text.partition("-")
    return (int(ms), int(n or 0))


def _feature(e: EntityData) -> dict[str, Any]:
    d = e.model_dump(mode="json")
    if isinstance(e, RouteData | ZoneData):
        geometry = d.pop("geometry")
        fid = d.pop("route_id" if isinstance(e, RouteData) else "zone_id")
        return {"type": "Feature", "id": fid, "geometry": geometry, "properties": d}
    fid = d.pop("vehicle_id")
    d["entity"] = "vehicle" if isinstance(e, VehicleData) else "assignment"
    return {"type": "Feature", "id": fid, "geometry": None, "properties": d}


def register_api(
    settings: Settings,
    entities: list[EntityData],
    api_url: str,
    api_key: str,
    *,
    timeout_s: float = 60.0,
    progress: Callable[[int], None] | None = None,
) -> RegistrationReport:
    """POST the entities to `/api/v1/import` in chunks (routes and zones before what refers to them)."""
    t0 = time.monotonic()
    before = master_end_offset(settings)
    changed = 0
    url = api_url.rstrip("/") + "/api/v1/import"
    for i in range(0, len(entities), IMPORT_CHUNK):
        chunk = entities[i : i + IMPORT_CHUNK]
        body = json.dumps({"type": "FeatureCollection", "features": [_feature(e) for e in chunk]}).encode()
        req = urllib.request.Request(
            url, data=body, method="POST", headers={"Content-Type": "application/json", "X-API-Key": api_key}
        )
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                result = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            raise RegistrationError(
                f"admin API refused the import ({exc.code}): {exc.read()[:500]!r}"
            ) from exc
        except urllib.error.URLError as exc:
            raise RegistrationError(f"admin API at {api_url} unreachable: {exc.reason}") from exc
        changed += int(result.get("created", 0)) + int(result.get("updated", 0))
        if progress is not None:
            progress(len(chunk))
    if changed:
        wait_master_published(settings, before + changed, timeout_s)
    return RegistrationReport(len(entities), changed, time.monotonic() - t0, f"admin API {api_url}")


def issue_credentials_direct(
    settings: Settings, vehicle_ids: list[str], *, progress: Callable[[int], None] | None = None
) -> dict[str, str]:
    """Each vehicle's MQTT secret, issued (or rotated, for a vehicle that has credentials already)
    through the vehicle master's credential service, as the admin API does."""
    from fleetfence.mqtt import DynSec
    from vehicle_master.credentials import CredentialStatus, VehicleCredentials

    r = redis.Redis.from_url(settings.redis_dsn)
    control = DynSec.from_settings(settings)
    out: dict[str, str] = {}
    try:
        creds = VehicleCredentials(r, settings.redis_prefix, control)
        for vid in vehicle_ids:
            rec = creds.get(vid)
            if rec is None or rec.status is CredentialStatus.REVOKED:
                _rec, out[vid] = creds.issue(vid)
            else:
                if rec.status is CredentialStatus.DISABLED:
                    creds.enable(vid)
                _rec, out[vid] = creds.rotate(vid)
            if progress is not None:
                progress(1)
    finally:
        control.close()
        r.close()
    return out


def issue_credentials_api(
    vehicle_ids: list[str], api_url: str, api_key: str, *, progress: Callable[[int], None] | None = None
) -> dict[str, str]:
    """Each vehicle's MQTT secret through the admin API, as an operator provisions trackers:
    POST .../credentials, or .../credentials/rotate for a vehicle that has some already."""
    base = api_url.rstrip("/") + "/api/v1/vehicles/"
    out: dict[str, str] = {}
    for vid in vehicle_ids:
        try:
            body = _post(base + f"{vid}/credentials", api_key)
        except urllib.error.HTTPError as exc:
            if exc.code != 409:
                raise RegistrationError(
                    f"admin API refused credentials for {vid} ({exc.code}): {exc.read()[:300]!r}"
                ) from exc
            body = _post(base + f"{vid}/credentials/rotate", api_key)
        out[vid] = str(body["password"])
        if progress is not None:
            progress(1)
    return out


def _post(url: str, api_key: str) -> dict[str, Any]:
    req = urllib.request.Request(url, data=b"", method="POST", headers={"X-API-Key": api_key})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return dict(json.loads(resp.read()))
    except urllib.error.URLError as exc:
        if isinstance(exc, urllib.error.HTTPError):
            raise
        raise RegistrationError(f"admin API at {url} unreachable: {exc.reason}") from exc
