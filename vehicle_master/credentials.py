"""Each vehicle's device credentials: issued, rotated, disabled, enabled and revoked through here.

Two places check them. FleetFence's own device edge (`gateway.edge`, the listener vehicles send
their fixes to) checks every login against the status and the secret's salted hash kept here, in
Redis beside the vehicle master (`fleetfence.devices`). Mosquitto's dynamic-security plugin keeps
its own hash of the same secret for what vehicles still do on the broker (reading their alerts).
The secret is generated here, handed to the caller once and never stored in clear. The broker is
changed first and the status written after, so a failure in between leaves the status behind the
broker (a revoked vehicle still shown active until the call is repeated): the edge reads the
status, so the call is repeated until both agree, and the edge never admits a vehicle shown revoked.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from enum import StrEnum
from typing import Any

import redis

from fleetfence.contracts import ms_to_iso, utc_now_ms
from fleetfence.devices import SECRET_HASH_FIELD, credentials_key, secret_hash
from fleetfence.mqtt import DynSec, new_secret
from vehicle_master.errors import CredentialsExistError, NoCredentialsError

logger = logging.getLogger(__name__)


class CredentialStatus(StrEnum):
    ACTIVE = "active"
    DISABLED = "disabled"
    REVOKED = "revoked"


@dataclass(frozen=True)
class CredentialRecord:
    """A vehicle's credential status (never the secret). Times in UTC milliseconds."""

    vehicle_id: str
    username: str
    status: CredentialStatus
    issued_ms: int
    rotated_ms: int | None = None
    disabled_ms: int | None = None
    revoked_ms: int | None = None

    def to_api(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("issued", "rotated", "disabled", "revoked"):
            ms = d.pop(f"{k}_ms")
            d[f"{k}_at"] = ms_to_iso(ms) if ms is not None else None
        d["status"] = self.status.value
        return d


def decode_credentials(vehicle_id: str, raw: Mapping[Any, Any]) -> CredentialRecord | None:
    """A status record as Redis returns the hash (empty: never issued)."""
    if not raw:
        return None
    d = {_text(k): _text(v) for k, v in raw.items()}

    def ms(name: str) -> int | None:
        v = d.get(name)
        return int(v) if v else None

    return CredentialRecord(
        vehicle_id=vehicle_id,
        username=d.get("username", vehicle_id),
        status=CredentialStatus(d["status"]),
        issued_ms=int(d["issued_ms"]),
        rotated_ms=ms("rotated_ms"),
        disabled_ms=ms("disabled_ms"),
        revoked_ms=ms("revoked_ms"),
    )


def _text(x: bytes | str) -> str:
    return x.decode() if isinstance(x, bytes) else x


class VehicleCredentials:
    """The credential life cycle of vehicles: status in Redis, the secret's check in Mosquitto."""

    def __init__(self, r: redis.Redis, prefix: str, control: DynSec) -> None:
        self.r = r
        self.prefix = prefix
        self.control = control

    def get(self, vehicle_id: str) -> CredentialRecord | None:
        return decode_credentials(vehicle_id, self.r.hgetall(credentials_key(self.prefix, vehicle_id)))

    def _save(self, rec: CredentialRecord, secret: str | None = None) -> CredentialRecord:
        """Write the status; with `secret`, also its hash, which FleetFence's device edge checks
        logins against (fleetfence.devices)."""
        fields: dict[Any, Any] = {
            k: ("" if v is None else str(v)) for k, v in asdict(rec).items() if k != "vehicle_id"
        }
        fields["status"] = rec.status.value
        if secret is not None:
            fields[SECRET_HASH_FIELD] = secret_hash(secret)
        self.r.hset(credentials_key(self.prefix, rec.vehicle_id), mapping=fields)
        return rec

    def issue(self, vehicle_id: str) -> tuple[CredentialRecord, str]:
        """New credentials (username = vehicle id) and the secret, shown this once. A vehicle whose
        credentials are active or disabled gets CredentialsExistError (rotate them); a revoked one
        gets new ones."""
        old = self.get(vehicle_id)
        if old is not None and old.status is not CredentialStatus.REVOKED:
            raise CredentialsExistError(
                f"vehicle {vehicle_id!r} already has credentials ({old.status.value}): rotate them instead"
            )
        secret = new_secret()
        self.control.create_vehicle(vehicle_id, secret)
        rec = self._save(
            CredentialRecord(vehicle_id, vehicle_id, CredentialStatus.ACTIVE, utc_now_ms()), secret
        )
        logger.info("vehicle credentials issued vehicle_id=%s", vehicle_id)
        return rec, secret

    def _current(self, vehicle_id: str) -> CredentialRecord:
        rec = self.get(vehicle_id)
        if rec is None or rec.status is CredentialStatus.REVOKED:
            raise NoCredentialsError(f"vehicle {vehicle_id!r} has no credentials (issue them first)")
        return rec

    def rotate(self, vehicle_id: str) -> tuple[CredentialRecord, str]:
        """A new secret; the old one stops working at once and a client logged in with it is
        disconnected. The status (active or disabled) stays."""
        rec = self._current(vehicle_id)
        secret = new_secret()
        self.control.set_password(vehicle_id, secret)
        rec = self._save(replace(rec, rotated_ms=utc_now_ms()), secret)
        logger.info("vehicle credentials rotated vehicle_id=%s", vehicle_id)
        return rec, secret

    def disable(self, vehicle_id: str) -> CredentialRecord:
        """The vehicle cannot log in (a connected one is disconnected at once) until enabled."""
        rec = self._current(vehicle_id)
        self.control.disable(vehicle_id)
        rec = self._save(replace(rec, status=CredentialStatus.DISABLED, disabled_ms=utc_now_ms()))
        logger.info("vehicle credentials disabled vehicle_id=%s", vehicle_id)
        return rec

    def enable(self, vehicle_id: str) -> CredentialRecord:
        rec = self._current(vehicle_id)
        self.control.enable(vehicle_id)
        rec = self._save(replace(rec, status=CredentialStatus.ACTIVE, disabled_ms=None))
        logger.info("vehicle credentials enabled vehicle_id=%s", vehicle_id)
        return rec

    def revoke(self, vehicle_id: str) -> CredentialRecord | None:
        """The vehicle's client and role are deleted in the broker (a connected one is disconnected
        at once); its status says revoked. None when it never had credentials. Idempotent."""
        rec = self.get(vehicle_id)
        if rec is None:
            return None
        self.control.delete_vehicle(vehicle_id)
        if rec.status is CredentialStatus.REVOKED:
            return rec
        rec = self._save(replace(rec, status=CredentialStatus.REVOKED, revoked_ms=utc_now_ms()))
        logger.info("vehicle credentials revoked vehicle_id=%s", vehicle_id)
        return rec
