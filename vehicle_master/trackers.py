"""Which tracker speaks for which vehicle: the bindings the device edge admits trackers by.

A Teltonika unit says only its IMEI when it connects; FleetFence turns that into a vehicle id
through a binding kept in Redis beside the vehicle master (`fleetfence.devices.tracker_key`). A
tracker is bound to one vehicle at a time (a second binding is refused, so one unit's fixes never
land on two vehicles); a vehicle may have several trackers (a hard-wired unit and a phone). The
edge reads the binding at every connection and again every `gateway_edge_recheck_s`, so an
unbinding cuts a connected tracker off within that time.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

import redis
from redis.client import Pipeline

from fleetfence.devices import TRACKER_ID_RE, TrackerProtocol, tracker_key, vehicle_trackers_key
from vehicle_master.errors import MasterValidationError, NotFoundError, TrackerBoundError

logger = logging.getLogger(__name__)


def _text(x: bytes | str) -> str:
    return x.decode() if isinstance(x, bytes) else x


def check_tracker_id(protocol: TrackerProtocol, tracker_id: str) -> None:
    if not TRACKER_ID_RE[protocol].fullmatch(tracker_id):
        raise MasterValidationError(
            f"{tracker_id!r} is not a {protocol.value} tracker id ({TRACKER_ID_RE[protocol].pattern})",
            ("tracker_id",),
        )


class VehicleTrackers:
    """Bind, unbind and list trackers (the vehicle's existence is checked by the caller)."""

    def __init__(self, r: redis.Redis, prefix: str) -> None:
        self.r = r
        self.prefix = prefix

    def bound_to(self, protocol: TrackerProtocol, tracker_id: str) -> str | None:
        v = self.r.get(tracker_key(self.prefix, protocol, tracker_id))
        return None if v is None else _text(v)

    def of_vehicle(self, vehicle_id: str) -> list[tuple[TrackerProtocol, str]]:
        members = self.r.smembers(vehicle_trackers_key(self.prefix, vehicle_id))
        out = []
        for m in sorted(_text(x) for x in members):
            protocol, _, tracker_id = m.partition(":")
            out.append((TrackerProtocol(protocol), tracker_id))
        return out

    def bind(self, vehicle_id: str, protocol: TrackerProtocol, tracker_id: str) -> bool:
        """Bind the tracker to the vehicle; False when it was bound to it already (idempotent).
        TrackerBoundError when another vehicle has it: unbind it there first."""
        check_tracker_id(protocol, tracker_id)
        key = tracker_key(self.prefix, protocol, tracker_id)
        member = f"{protocol.value}:{tracker_id}"

        def tx(pipe: Pipeline) -> bool:
            current = pipe.get(key)
            if current is not None:
                if _text(current) != vehicle_id:
                    raise TrackerBoundError(
                        f"{protocol.value} tracker {tracker_id} is bound to vehicle {_text(current)!r}: "
                        "unbind it there first"
                    )
                return False
            pipe.multi()
            pipe.set(key, vehicle_id)
            pipe.sadd(vehicle_trackers_key(self.prefix, vehicle_id), member)
            return True

        bound = self._watched(key, tx)
        if bound:
            logger.info(
                "tracker bound protocol=%s tracker_id=%s vehicle_id=%s", protocol, tracker_id, vehicle_id
            )
        return bound

    def unbind(self, vehicle_id: str, protocol: TrackerProtocol, tracker_id: str) -> None:
        """NotFoundError when the tracker is not bound to this vehicle."""
        check_tracker_id(protocol, tracker_id)
        key = tracker_key(self.prefix, protocol, tracker_id)

        def tx(pipe: Pipeline) -> bool:
            current = pipe.get(key)
            if current is None or _text(current) != vehicle_id:
                raise NotFoundError(
                    f"{protocol.value} tracker {tracker_id} is not bound to vehicle {vehicle_id!r}"
                )
            pipe.multi()
            pipe.delete(key)
            pipe.srem(vehicle_trackers_key(self.prefix, vehicle_id), f"{protocol.value}:{tracker_id}")
            return True

        self._watched(key, tx)
        logger.info(
            "tracker unbound protocol=%s tracker_id=%s vehicle_id=%s", protocol, tracker_id, vehicle_id
        )

    def _watched(self, key: str, tx: Callable[[Pipeline], bool]) -> bool:
        """Run `tx` on `key` watched, again whenever another writer changed it meanwhile: a tracker's
        binding and its vehicle's set change together or not at all."""
        # redis-py types the callable as returning None; with value_from_callable it returns tx's value.
        return bool(self.r.transaction(tx, key, value_from_callable=True))  # type: ignore[arg-type]

    def unbind_all(self, vehicle_id: str) -> int:
        """Every tracker of a vehicle unbound (its deletion); how many were."""
        trackers = self.of_vehicle(vehicle_id)
        for protocol, tracker_id in trackers:
            with contextlib.suppress(NotFoundError):  # unbound meanwhile
                self.unbind(vehicle_id, protocol, tracker_id)
        self.r.delete(vehicle_trackers_key(self.prefix, vehicle_id))
        return len(trackers)
