"""A device's login, checked where the device connects: the one form of a stored device secret.

FleetFence's own device edge (`gateway.edge`) acknowledges a fix only once Kafka has it, so it
must also be the one that decides who may send fixes: it cannot hand the login to a broker it no
longer sits behind. The vehicle master keeps, beside each vehicle's credential status
(`vehicle_master.credentials`), a salted hash of the secret in the same form Mosquitto's
dynamic-security plugin stores it (PBKDF2-HMAC-SHA512, `fleetfence.mqtt.hash_password`): the secret
itself is shown to the operator once and stored nowhere. Secrets are 32 random bytes, so the hash
needs no stretching to resist guessing, and a fleet reconnecting at once after a restart costs
milliseconds, not minutes, of CPU.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from fleetfence.mqtt import hash_password

SECRET_HASH_FIELD = "secret_hash"
STATUS_FIELD = "status"
ACTIVE = "active"  # vehicle_master.credentials.CredentialStatus.ACTIVE's value


class LoginVerdict(StrEnum):
    """Why a device may or may not send: the label its refusals are counted under."""

    ACCEPTED = "accepted"
    UNKNOWN_DEVICE = "unknown_device"  # never issued, or revoked and removed
    NOT_ACTIVE = "not_active"  # disabled or revoked
    NO_SECRET_HASH = "no_secret_hash"  # issued before the edge existed: rotate to enrol
    BAD_SECRET = "bad_secret"
    NO_CREDENTIALS_GIVEN = "no_credentials_given"


def credentials_key(prefix: str, vehicle_id: str) -> str:
    """The Redis hash of a vehicle's credential status and secret hash."""
    return f"{prefix}mqtt:credentials:{vehicle_id}"


def secret_hash(secret: str) -> str:
    """What is stored for `secret`: the dynamic-security form as one JSON string."""
    return json.dumps(hash_password(secret), separators=(",", ":"))


def secret_matches(secret: bytes, stored: str) -> bool:
    """Whether `secret` is the one `stored` was made from (constant time; False for a damaged
    record, which refuses the login instead of failing the connection)."""
    try:
        d = json.loads(stored)
        salt = base64.b64decode(d["salt"], validate=True)
        expected = base64.b64decode(d["password"], validate=True)
        iterations = int(d["iterations"])
    except (ValueError, KeyError, TypeError, binascii.Error):
        return False
    if not 1 <= iterations <= 1_000_000:
        return False
    got = hashlib.pbkdf2_hmac("sha512", secret, salt, iterations, len(expected))
    return hmac.compare_digest(got, expected)


def _text(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def check_login(record: Mapping[Any, Any], secret: bytes | None) -> LoginVerdict:
    """The verdict on a login with `secret` against a vehicle's credential record as Redis returns
    it (HGETALL; empty when the vehicle has none)."""
    if secret is None:
        return LoginVerdict.NO_CREDENTIALS_GIVEN
    if not record:
        return LoginVerdict.UNKNOWN_DEVICE
    d = {_text(k): _text(v) for k, v in record.items()}
    if d.get(STATUS_FIELD) != ACTIVE:
        return LoginVerdict.NOT_ACTIVE
    stored = d.get(SECRET_HASH_FIELD)
    if not stored:
        return LoginVerdict.NO_SECRET_HASH
    return LoginVerdict.ACCEPTED if secret_matches(secret, stored) else LoginVerdict.BAD_SECRET


# --------------------------------------------------------------------------- trackers' identities


class TrackerProtocol(StrEnum):
    """The tracker protocols the device edge speaks besides its MQTT (`gateway.protocols`)."""

    TELTONIKA = "teltonika"  # Codec 8 / 8 Extended over TCP: the device says its IMEI, no secret
    OSMAND = "osmand"  # Traccar Client over HTTP: the request says its device id, no secret


# A tracker's own id in its protocol: Teltonika's IMEI, 15 digits; Traccar Client's device
# identifier, free text in the app (a random number by default): letters, digits, `.`, `_`, `-`.
TRACKER_ID_RE = {
    TrackerProtocol.TELTONIKA: re.compile(r"[0-9]{15}"),
    TrackerProtocol.OSMAND: re.compile(r"[A-Za-z0-9._-]{1,64}"),
}


def tracker_key(prefix: str, protocol: TrackerProtocol, tracker_id: str) -> str:
    """The Redis string naming the vehicle a tracker is bound to."""
    return f"{prefix}tracker:{protocol.value}:{tracker_id}"


def vehicle_trackers_key(prefix: str, vehicle_id: str) -> str:
    """The Redis set of a vehicle's trackers, `protocol:id` each."""
    return f"{prefix}tracker:of:{vehicle_id}"


def tracker_verdict(vehicle_id: str | None, credentials: Mapping[Any, Any]) -> LoginVerdict:
    """Whether a tracker bound to `vehicle_id` (None: bound to nothing) may send, given the vehicle's
    credential record (HGETALL; empty when it has none). A tracker that says only its id (an IMEI)
    has no secret to check: it is admitted by its binding, and refused while its vehicle's
    credentials are disabled or revoked, so one switch stops a vehicle whatever it speaks."""
    if vehicle_id is None:
        return LoginVerdict.UNKNOWN_DEVICE
    status = {_text(k): _text(v) for k, v in credentials.items()}.get(STATUS_FIELD)
    if status is not None and status != ACTIVE:
        return LoginVerdict.NOT_ACTIVE
    return LoginVerdict.ACCEPTED
