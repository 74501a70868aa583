"""MQTT identities: who may connect to the broker and what each may publish or read.

Mosquitto checks every client itself, through its dynamic-security plugin (shipped in Debian's
`mosquitto` package and in the `eclipse-mosquitto` image), so no FleetFence process sits in the
vehicles' data path to do it:
- anonymous clients are refused (`allow_anonymous false`);
- each vehicle logs in as its vehicle id with a secret of its own and holds one role,
  `vehicle-<id>`, that lets it publish to `fleet/<id>/telemetry` and read `fleet/<id>/alerts`,
  nothing else (Mosquitto 2.0's dynamic security has no `%u` substitution, hence a role per
  vehicle; a role change kicks only the clients holding it, so only that vehicle);
- the service accounts: `admin` (FleetFence's control of the plugin over
  `$CONTROL/dynamic-security/v1`, and the health probe's private topics), `gateway` (the shared
  telemetry subscription and nothing else), `alerts` (publishes under the alert topics only).

The plugin hashes secrets (PBKDF2-SHA512) in its own JSON file, the one credential store; FleetFence
keeps only each vehicle's credential status (vehicle_master.credentials). The embedded broker's
service secrets are generated at `infra up` into its folder (mode 0600) unless the settings give
them (`FLEETFENCE_MQTT_<ACCOUNT>_PASSWORD`, as production does); every process on the machine
reads them from there, and no secret is ever logged. A production broker starts from a file holding
only the admin account of the settings (`bootstrap_dynsec`, which `fleetfence mqtt bootstrap` runs
before every start: it writes the file once and afterwards checks that the secret still opens it).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import logging
import os
import secrets
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from pydantic import SecretStr

from fleetfence.contracts import telemetry_topic
from fleetfence.errors import ConfigError, MqttControlError, ServiceUnavailableError
from fleetfence.files import Owner, Report, chown, describe, hand_over_dir, make_dirs, require_creatable
from fleetfence.settings import Settings

logger = logging.getLogger(__name__)

ServiceKind = Literal["admin", "gateway", "alerts"]
SERVICE_KINDS: tuple[ServiceKind, ...] = ("admin", "gateway", "alerts")
CONTROL_TOPIC = "$CONTROL/dynamic-security/v1"
HEALTH_TOPICS = "fleetfence/health/#"  # fleetfence.probes.mqtt_ping's private round trips
VEHICLE_ROLE_PREFIX = "vehicle-"
ACCOUNTS_FILE = "accounts.json"
DYNSEC_FILE = "dynamic-security.json"
# Mosquitto's own name for its persistence file (`persistence_file`'s default), written in
# `persistence_location`: deploy/mosquitto.conf puts it beside the plugin's file.
PERSISTENCE_FILE = "mosquitto.db"
PBKDF2_ITERATIONS = 101  # what Mosquitto itself writes; the secrets are 32 random bytes
MIN_ADMIN_SECRET_LEN = 16  # a production admin secret is chosen by an operator, not generated


@dataclass(frozen=True)
class Account:
    """A username and its secret; the secret never appears in a repr (logs, tracebacks)."""

    username: str
    password: str = field(repr=False)


def acl(kind: str, topic: str, allow: bool = True) -> dict[str, Any]:
    return {"acltype": kind, "topic": topic, "allow": allow}


def service_acls(kind: ServiceKind) -> list[dict[str, Any]]:
    """What each service account may do, and nothing more."""
    if kind == "admin":
        return [
            acl("publishClientSend", f"{CONTROL_TOPIC}"),
            acl("subscribeLiteral", f"{CONTROL_TOPIC}/response"),
            acl("publishClientReceive", f"{CONTROL_TOPIC}/response"),
            acl("publishClientSend", HEALTH_TOPICS),
            acl("subscribePattern", HEALTH_TOPICS),
            acl("publishClientReceive", HEALTH_TOPICS),
        ]
    if kind == "gateway":
        # Every replica subscribes to every vehicle's telemetry and forwards its shard's
        # (gateway.core.Shard): a replica that could subscribe but not receive would lose its shard.
        return [
            acl("subscribePattern", "fleet/+/telemetry"),
            acl("publishClientReceive", "fleet/+/telemetry"),
        ]
    # The alert fan-out's default topics (alerts.config.MqttConfig): per vehicle and fleet-wide.
    return [acl("publishClientSend", "fleet/+/alerts"), acl("publishClientSend", "fleet/alerts")]


def vehicle_role(vehicle_id: str) -> str:
    return f"{VEHICLE_ROLE_PREFIX}{vehicle_id}"


def vehicle_acls(vehicle_id: str) -> list[dict[str, Any]]:
    """A vehicle publishes its own telemetry and may read its own alerts."""
    alerts = f"fleet/{vehicle_id}/alerts"
    return [
        acl("publishClientSend", telemetry_topic(vehicle_id)),
        acl("subscribeLiteral", alerts),
        acl("publishClientReceive", alerts),
    ]


def new_secret() -> str:
    return secrets.token_urlsafe(32)


def hash_password(
    password: str, salt: bytes | None = None, iterations: int = PBKDF2_ITERATIONS
) -> dict[str, Any]:
    """The dynamic-security file's form of a password: PBKDF2-HMAC-SHA512 over 12 random bytes of
    salt, 64 bytes of hash, both base64."""
    salt = salt if salt is not None else os.urandom(12)
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations, 64)
    return {
        "password": base64.b64encode(digest).decode(),
        "salt": base64.b64encode(salt).decode(),
        "iterations": iterations,
    }


def bootstrap_config(admin: Account) -> dict[str, Any]:
    """A first dynamic-security file: the admin account and its role; the default ACL access of
    Mosquitto's own `dynsec init` (nobody publishes or subscribes without a role that says so)."""
    return {
        "clients": [
            {
                "username": admin.username,
                "textName": "FleetFence administration",
                **hash_password(admin.password),
                "roles": [{"rolename": admin.username}],
            }
        ],
        "roles": [{"rolename": admin.username, "acls": service_acls("admin")}],
        "defaultACLAccess": {
            "publishClientSend": False,
            "publishClientReceive": True,
            "subscribe": False,
            "unsubscribe": True,
        },
    }


# --------------------------------------------------------------------------- service accounts


def _configured(settings: Settings, kind: ServiceKind) -> Account | None:
    secret = getattr(settings, f"mqtt_{kind}_password")
    if secret is None:
        return None
    return Account(getattr(settings, f"mqtt_{kind}_username"), secret.get_secret_value())


def embedded_accounts(settings: Settings, *, create: bool = False) -> dict[str, Account]:
    """The service accounts of this state folder's broker: the configured ones, the others from
    its accounts file (generated when `create`, by `infra up`, which keeps them across restarts)."""
    path = settings.mqtt_dir / ACCOUNTS_FILE
    stored: dict[str, Any] = {}
    if path.exists():
        stored = json.loads(path.read_text())
    out: dict[str, Account] = {}
    changed = False
    for kind in SERVICE_KINDS:
        given = _configured(settings, kind)
        if given is not None:
            out[kind] = given
        elif kind in stored:
            out[kind] = Account(stored[kind]["username"], stored[kind]["password"])
        elif create:
            out[kind] = Account(getattr(settings, f"mqtt_{kind}_username"), new_secret())
            stored[kind] = {"username": out[kind].username, "password": out[kind].password}
            changed = True
    if changed:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(stored, f)
        tmp.replace(path)
    return out


def service_account(settings: Settings, kind: ServiceKind) -> Account | None:
    """The account a service logs in with; None when MQTT authentication is off."""
    if not settings.mqtt_auth:
        return None
    given = _configured(settings, kind)
    if given is not None:
        return given
    found = embedded_accounts(settings).get(kind)
    if found is None:
        raise ConfigError(
            f"no MQTT secret for the {kind} account: set FLEETFENCE_MQTT_{kind.upper()}_PASSWORD, or "
            f"run `fleetfence infra up`, which creates the embedded broker's accounts in {settings.mqtt_dir}"
        )
    return found


def login(client: mqtt.Client, account: Account | None) -> None:
    """Give a client its credentials (nothing when authentication is off)."""
    if account is not None:
        client.username_pw_set(account.username, account.password)


# --------------------------------------------------------------------------- the plugin's control


class DynSec:
    """FleetFence's control of Mosquitto's dynamic-security plugin, as the admin account: JSON
    commands to `$CONTROL/dynamic-security/v1`, each answered on its response topic.

    One request at a time (a lock), matched to its answer by correlation data. A command the
    plugin refuses raises MqttControlError with its error, except the errors a caller says it
    tolerates (e.g. "Client not found" when deleting)."""

    def __init__(self, host: str, port: int, admin: Account, timeout_s: float = 10.0) -> None:
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._cond = threading.Condition()
        self._answers: dict[str, list[dict[str, Any]]] = {}
        self._ready = threading.Event()
        self._refused: str | None = None
        self._client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"fleetfence-dynsec-{uuid.uuid4().hex[:8]}",
            protocol=mqtt.MQTTv5,
        )
        login(self._client, admin)
        self._client.on_connect = self._on_connect
        self._client.on_subscribe = lambda *_a: self._ready.set()
        self._client.on_message = self._on_message
        self._client.reconnect_delay_set(min_delay=1, max_delay=5)
        try:
            self._client.connect(host, port, keepalive=30)
        except OSError as exc:
            raise ServiceUnavailableError(f"MQTT {host}:{port} refused: {exc}") from exc
        self._client.loop_start()
        if not self._ready.wait(timeout_s):
            self.close()
            why = self._refused or "no answer"
            raise ServiceUnavailableError(f"MQTT {host}:{port}: dynamic-security control not ready ({why})")

    @classmethod
    def from_settings(cls, settings: Settings) -> DynSec:
        admin = service_account(settings, "admin")
        if admin is None:
            raise ConfigError(
                "MQTT authentication is off (FLEETFENCE_MQTT_AUTH=false): no credentials to manage"
            )
        return cls(*settings.mqtt_host_port, admin)

    def _on_connect(self, client: mqtt.Client, _u: Any, _f: Any, rc: Any, _p: Any = None) -> None:
        if rc.is_failure:
            self._refused = str(rc)
            logger.warning("mqtt control connection refused reason=%s", rc)
            return
        client.subscribe(f"{CONTROL_TOPIC}/response", qos=1)

    def _on_message(self, _c: mqtt.Client, _u: Any, msg: mqtt.MQTTMessage) -> None:
        try:
            responses = json.loads(msg.payload)["responses"]
        except (ValueError, KeyError, TypeError):
            logger.warning("mqtt control answer unreadable payload=%r", msg.payload[:200])
            return
        corr = str(responses[0].get("correlationData", "")) if responses else ""
        with self._cond:
            self._answers[corr] = responses
            self._cond.notify_all()

    def command(self, *commands: dict[str, Any], tolerate: tuple[str, ...] = ()) -> list[dict[str, Any]]:
        """Send the commands in one message and return their responses, in order."""
        with self._lock:
            # The plugin echoes a command's correlationData in its response (a JSON field).
            corr = uuid.uuid4().hex
            body = {"commands": [{**c, "correlationData": corr} for c in commands]}
            info = self._client.publish(CONTROL_TOPIC, json.dumps(body), qos=1)
            if info.rc != mqtt.MQTT_ERR_SUCCESS:
                raise ServiceUnavailableError(f"MQTT control: {mqtt.error_string(info.rc)}")
            with self._cond:
                if not self._cond.wait_for(lambda: corr in self._answers, self.timeout_s):
                    raise ServiceUnavailableError(f"MQTT control: no answer within {self.timeout_s}s")
                responses = self._answers.pop(corr)
        for cmd, resp in zip(commands, responses, strict=False):
            err = resp.get("error")
            if err and err not in tolerate:
                raise MqttControlError(f"{cmd['command']} refused by Mosquitto: {err}")
        return responses

    # ------------------------------------------------------------------ accounts and roles

    def ensure_account(self, account: Account, acls: list[dict[str, Any]], role: str | None = None) -> None:
        """The account with a role of these ACLs (named after it unless `role`); an existing role
        gains missing ACLs, an existing client keeps its password (rotate with `set_password`)."""
        role = role or account.username
        self.command(
            {"command": "createRole", "rolename": role, "acls": acls}, tolerate=("Role already exists",)
        )
        self.command(
            *({"command": "addRoleACL", "rolename": role, **a} for a in acls),
            tolerate=("ACL with this topic already exists",),
        )
        if not self.client_exists(account.username):
            self._create_client(account.username, account.password, role)

    def _create_client(self, username: str, password: str, role: str) -> None:
        # Never `roles` inside createClient: Mosquitto 2.0.11 does not link such a client to its
        # role, and deleting the role later crashes the broker. addClientRole in the same message
        # (and only for a new client: adding a role it holds is an "Internal error").
        self.command(
            {"command": "createClient", "username": username, "password": password},
            {"command": "addClientRole", "username": username, "rolename": role},
        )

    def ensure_service_accounts(self, accounts: dict[str, Account]) -> None:
        """The gateway and alerts accounts (the admin one exists: it is the one speaking)."""
        for kind in ("gateway", "alerts"):
            if kind in accounts:
                self.ensure_account(accounts[kind], service_acls(kind))

    def create_vehicle(self, vehicle_id: str, password: str) -> None:
        """A vehicle's role and client with this secret; an existing client (an earlier issue
        whose status was lost) gets the new secret and is enabled."""
        role = vehicle_role(vehicle_id)
        self.command(
            {"command": "createRole", "rolename": role, "acls": vehicle_acls(vehicle_id)},
            tolerate=("Role already exists",),
        )
        if self.client_exists(vehicle_id):
            self.set_password(vehicle_id, password)
            self.enable(vehicle_id)
        else:
            self._create_client(vehicle_id, password, role)

    def set_password(self, username: str, password: str) -> None:
        """A new secret; a client connected with the old one is disconnected at once."""
        self.command({"command": "setClientPassword", "username": username, "password": password})

    def disable(self, username: str) -> None:
        self.command({"command": "disableClient", "username": username})

    def enable(self, username: str) -> None:
        self.command({"command": "enableClient", "username": username})

    def delete_vehicle(self, vehicle_id: str) -> None:
        """The client and its role; a connected client is disconnected at once. Idempotent."""
        self.command(
            {"command": "deleteClient", "username": vehicle_id},
            {"command": "deleteRole", "rolename": vehicle_role(vehicle_id)},
            tolerate=("Client not found", "Role not found"),
        )

    def client_exists(self, username: str) -> bool:
        (resp,) = self.command({"command": "getClient", "username": username}, tolerate=("Client not found",))
        return "error" not in resp

    def close(self) -> None:
        self._client.disconnect()
        self._client.loop_stop()


def write_bootstrap(path: Path, admin: Account) -> None:
    """The first dynamic-security file, unless the broker already has one (it holds every
    vehicle's client and must survive restarts)."""
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(bootstrap_config(admin), f, indent=1)


# --------------------------------------------------------------------------- a production broker's first file


def admin_account(settings: Settings) -> Account:
    """The admin account a production broker is bootstrapped with: only from the settings."""
    if not settings.mqtt_auth:
        raise ConfigError("MQTT authentication is off (FLEETFENCE_MQTT_AUTH=false): nothing to bootstrap")
    secret = settings.mqtt_admin_password
    if secret is None:
        raise ConfigError(
            "set FLEETFENCE_MQTT_ADMIN_PASSWORD (the admin account's secret; every process that "
            "manages the broker's accounts, the admin API among them, needs the same value)"
        )
    if len(secret.get_secret_value()) < MIN_ADMIN_SECRET_LEN:
        raise ConfigError(
            f"FLEETFENCE_MQTT_ADMIN_PASSWORD is shorter than {MIN_ADMIN_SECRET_LEN} characters; generate "
            "one with: python3 -c 'import secrets; print(secrets.token_urlsafe(32))'"
        )
    return Account(settings.mqtt_admin_username, secret.get_secret_value())


def check_admin(path: Path, admin: Account) -> None:
    """An existing dynamic-security file must hold the admin account with this very secret:
    otherwise nothing could manage the broker, and every service would fail later and less
    clearly."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"{path} exists but cannot be read as JSON ({exc}): restore it from a backup"
        ) from exc
    clients: list[dict[str, Any]] = data.get("clients", []) if isinstance(data, dict) else []
    entry = next((c for c in clients if c.get("username") == admin.username), None)
    if entry is None:
        raise ConfigError(
            f"{path} has no client {admin.username!r} (FLEETFENCE_MQTT_ADMIN_USERNAME changed after the "
            "first start?)"
        )
    try:
        salt = base64.b64decode(entry["salt"])
        stored = base64.b64decode(entry["password"])
        iterations = int(entry["iterations"])
    except (KeyError, ValueError, TypeError, binascii.Error) as exc:
        raise ConfigError(f"{path}: the client {admin.username!r} has no readable password hash") from exc
    computed = base64.b64decode(hash_password(admin.password, salt, iterations)["password"])
    if not hmac.compare_digest(computed, stored):
        raise ConfigError(
            f"FLEETFENCE_MQTT_ADMIN_PASSWORD is not the secret of {admin.username!r} in {path} (changed "
            "after the first start?): set the old one back, or change it in the broker first"
        )


def bootstrap_dynsec(path: Path, admin: Account, owner: Owner | None, report: Report) -> None:
    """The production broker's dynamic-security file: written with the admin account when missing,
    checked when present (never rewritten: it holds every vehicle's client); then its folder, the
    broker's data folder, handed to the broker's user and tried as that user.

    The folder, not only the file: Mosquitto writes its persistence file there (`mosquitto.db`,
    every client's session and queued messages: deploy/mosquitto.conf's `persistence_location` is
    this folder) by creating `mosquitto.db.new` and renaming it, and since 2.0.18 (the official
    image runs 2.0.22) the plugin saves its own file the same way. In the compose deployment the
    folder is the `mosquitto-data` volume's mount point, which Docker creates root:root 0755 when
    this bootstrap first mounts it. Handing over only the file left the broker unable to persist
    anything ("Error: Permission denied." at every autosave, nothing kept across a restart) on an
    image whose entrypoint does not `chown` it (the local stand-in; eclipse-mosquitto's does, when
    started as root). Handed over here, every image path is the same; and the final check makes a
    folder the broker still cannot write in (an ACL, a read-only or root-squashed mount, a folder
    above it closed) fail this step, so the broker never starts to fail quietly."""
    folder = path.parent
    make_dirs(folder, 0o700, owner)  # a new folder is the broker's from the start
    if path.exists():
        check_admin(path, admin)
        if owner is not None:
            chown(path, owner)
        report.step("kept", f"{path} (exists; its {admin.username!r} account has the configured secret)")
    else:
        try:
            write_bootstrap(path, admin)
        except OSError as exc:
            raise ConfigError(f"cannot write {path}: {exc}") from exc
        chown(path, owner)
        report.step("wrote", f"{path} (the admin account {admin.username!r} and its role; mode 0600)")
    if owner is not None:
        before = hand_over_dir(folder, owner)
        if before is not None:
            report.step("gave", f"{folder} to uid {owner[0]} gid {owner[1]} (was {before}): the broker's")
        # What else the broker writes there, should an earlier start have left it another's: its
        # persistence file and the ".new" file each save is first written to.
        for name in (PERSISTENCE_FILE, f"{PERSISTENCE_FILE}.new", f"{path.name}.new"):
            if (folder / name).exists():
                chown(folder / name, owner)
    require_creatable(
        folder,
        owner,
        "the broker",
        f"Mosquitto writes its persistence file ({PERSISTENCE_FILE}: sessions and queued messages) and "
        'saves the plugin\'s file there; it would log "Error: Permission denied." at every autosave '
        f"and keep nothing across a restart. Give the folder to the broker's user (chown "
        f"{'UID:GID' if owner is None else f'{owner[0]}:{owner[1]}'} {folder}), or run this as root "
        "with --owner.",
    )
    report.step("checked", f"{folder}: the broker can create its files there ({describe(folder)})")


def account_fields(settings: Settings) -> dict[str, Any]:
    """Settings fields that give this broker's service accounts to settings reaching it as an
    external endpoint (`FLEETFENCE_MQTT_URL`): how a test or a second installation on the machine
    shares the embedded broker."""
    out: dict[str, Any] = {}
    for kind in SERVICE_KINDS:
        account = service_account(settings, kind)
        if account is not None:
            out[f"mqtt_{kind}_password"] = SecretStr(account.password)
    return out


def account_env(settings: Settings) -> dict[str, str]:
    """The same as environment variables, for a child process."""
    return {f"FLEETFENCE_{k.upper()}": v.get_secret_value() for k, v in account_fields(settings).items()}
