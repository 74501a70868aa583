"""Declarative receiver configuration: a TOML file (tomllib) validated by pydantic.

Adding a subscriber is a config change, not code: each `[[receivers]]` table names a receiver,
its kind and its filter. Unknown keys are errors (a typo such as `filtr` must not silently turn a
narrow receiver into one that gets every alert). Secrets are read from a named environment
variable so the file can be committed.
"""

from __future__ import annotations

import ipaddress
import os
import re
import string
import tomllib
from email.utils import parseaddr
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from alerts.model import AlertFilter
from fleetfence.contracts import AlertType
from fleetfence.errors import ConfigError, ContractError
from fleetfence.settings import Settings

RECEIVER_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
WEEK_S = 7 * 24 * 3600
# The Prometheus endpoint of `alerts run`; when this default is busy (a second process on the host)
# it serves on an ephemeral port and announces that one (fleetfence.metrics, fleetfence.registry).
ALERTS_METRICS_PORT = 9466


class AlertsSettings(Settings):
    """Settings of the alert receivers (env prefix FLEETFENCE_, see the README)."""

    alerts_config: Path | None = Field(default=None, description="TOML file with the receivers.")
    alerts_dedup_ttl_s: int = Field(
        default=WEEK_S, gt=0, description="How long a receiver remembers an alert_id it handled."
    )
    alerts_commit_interval_ms: int = Field(
        default=1000, ge=0, description="How often receivers commit their offsets (0: after every batch)."
    )
    alerts_instance_id: str | None = Field(
        default=None,
        description="Static group member id of this process (default: the host name); unique per process.",
    )
    alerts_metrics_port: int = Field(
        default=ALERTS_METRICS_PORT,
        ge=0,
        le=65535,
        description="Port of the Prometheus endpoint of `alerts run`, 0 = off; the default, when busy, "
        "falls back to an ephemeral port.",
    )


class FilterConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    types: list[str] = Field(default_factory=list)
    vehicles: list[str] = Field(default_factory=list)
    routes: list[str] = Field(default_factory=list)

    @field_validator("types")
    @classmethod
    def _known_types(cls, v: list[str]) -> list[str]:
        known = {t.value for t in AlertType}
        bad = [t for t in v if t.upper() not in known]
        if bad:
            raise ValueError(f"unknown alert types {bad}; known: {sorted(known)}")
        return [t.upper() for t in v]

    def build(self) -> AlertFilter:
        return AlertFilter.of(self.types, self.vehicles, self.routes)


class _ReceiverBase(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    enabled: bool = True
    filter: FilterConfig = Field(default_factory=FilterConfig)
    group_id: str | None = Field(default=None, description="Consumer group; default derived from name.")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not RECEIVER_NAME_RE.match(v):
            raise ValueError(f"receiver name {v!r} must match {RECEIVER_NAME_RE.pattern}")
        return v


DEFAULT_HISTORY_RETENTION_DAYS = 30.0


class HistoryConfig(_ReceiverBase):
    kind: Literal["history"]
    # Alerts older than this (by event time) leave the history read model, a batch at a time as new
    # ones come; an open condition's alert stays while it is open. Bounded by default: each alert
    # costs Redis about 1 KiB, and a default that kept every alert filled a default installation's
    # Redis (issue #64). 30 days is the deployment's setting (deploy/receivers.toml) and fits the
    # sizing table (docs/deploy.md); the long-term record is the archive (docs/history.md).
    retention_days: float = Field(default=DEFAULT_HISTORY_RETENTION_DAYS, gt=0)


class MqttConfig(_ReceiverBase):
    kind: Literal["mqtt"]
    vehicle_topic: str = "fleet/{vehicle_id}/alerts"
    all_topic: str | None = "fleet/alerts"
    qos: Literal[0, 1, 2] = 1
    retain_per_vehicle: bool = True
    publish_timeout_s: float = Field(default=10.0, gt=0)

    @field_validator("vehicle_topic")
    @classmethod
    def _has_vehicle(cls, v: str) -> str:
        if "{vehicle_id}" not in v:
            raise ValueError("vehicle_topic must contain {vehicle_id}")
        return v


class WebhookConfig(_ReceiverBase):
    kind: Literal["webhook"]
    url: str
    secret: str | None = Field(default=None, description="HMAC secret (prefer secret_env).")
    secret_env: str | None = Field(default=None, description="Environment variable holding the secret.")
    max_attempts: int = Field(default=5, ge=1, le=20)
    backoff_initial_ms: int = Field(default=200, ge=0)
    backoff_max_ms: int = Field(default=10_000, ge=0)
    timeout_s: float = Field(default=5.0, gt=0, le=60)
    headers: dict[str, str] = Field(default_factory=dict)

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not re.match(r"^https?://[^/\s]+", v):
            raise ValueError(f"url {v!r} must be http:// or https://")
        return v

    @model_validator(mode="after")
    def _bounded(self) -> WebhookConfig:
        if self.backoff_max_ms < self.backoff_initial_ms:
            raise ValueError("backoff_max_ms must be >= backoff_initial_ms")
        # One alert blocks its receiver while it is retried; the whole retry budget must stay well
        # under the consumer's max.poll.interval.ms (300 s) or the group would evict the receiver.
        worst_s = self.max_attempts * (self.timeout_s + self.backoff_max_ms / 1000)
        if worst_s > 240:
            raise ValueError(
                f"retry budget max_attempts*(timeout_s+backoff_max_ms) = {worst_s:.0f}s exceeds 240s"
            )
        if self.secret is None and self.secret_env is None:
            raise ValueError("set secret_env (the name of an environment variable) or secret")
        return self

    def resolve_secret(self) -> bytes:
        if self.secret_env is not None:
            value = os.environ.get(self.secret_env)
            if not value:
                raise ConfigError(
                    f"receiver {self.name!r}: environment variable {self.secret_env} (secret_env) is not set"
                )
            return value.encode()
        assert self.secret is not None
        return self.secret.encode()


# The placeholders of an e-mail's templates (string.Template: `$name` or `${name}`), filled by
# alerts/email.py. Per alert: the alert's own fields, `time` its event time (ts_ms) in UTC ISO 8601,
# `place` its zone or else its route ("-" for neither), `details` its details as `key=value` pairs.
ALERT_FIELDS = frozenset(
    {"type", "vehicle_id", "zone_id", "route_id", "place", "time", "seq", "alert_id", "lat", "lon", "details"}
)
# Per mail of several alerts: how many, the types with their counts, the first and last event time.
BATCH_FIELDS = frozenset({"count", "types", "vehicles", "first_time", "last_time"})
DEFAULT_SUBJECT = "[FleetFence] $type $vehicle_id at $place"
DEFAULT_BODY = (
    "$type\n"
    "vehicle:  $vehicle_id\n"
    "where:    $place (zone $zone_id, route $route_id)\n"
    "time:     $time (UTC)\n"
    "position: $lat, $lon\n"
    "details:  $details\n"
    "alert id: $alert_id\n"
)
DEFAULT_BATCH_SUBJECT = "[FleetFence] $count alerts: $types"
LOOPBACK_NAMES = frozenset({"localhost"})
#: How long a worst-case flush may block its receiver: well under max.poll.interval.ms (300 s).
MAX_FLUSH_S = 240


def check_template(text: str, allowed: frozenset[str], where: str) -> str:
    """A template with a placeholder it will not get, or a stray `$`, is a config error at load, so
    rendering (`Template.substitute` with every allowed name) never fails at run time."""
    t = string.Template(text)
    if not t.is_valid():
        raise ValueError(f"{where}: invalid template {text!r} (a lone '$'? write '$$' for a dollar sign)")
    unknown = sorted(set(t.get_identifiers()) - allowed)
    if unknown:
        raise ValueError(f"{where}: unknown placeholders {unknown}; known: {sorted(allowed)}")
    return text


def _address(v: str, what: str) -> str:
    """`user@domain` or `Name <user@domain>`: what smtplib puts in the envelope."""
    _name, spec = parseaddr(v)
    user, _, domain = spec.rpartition("@")
    if not user or not domain or any(c.isspace() for c in spec):
        raise ValueError(f"{what} {v!r} is not an e-mail address (user@domain or Name <user@domain>)")
    return v


def _is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class EmailConfig(_ReceiverBase):
    """E-mail over SMTP (alerts/email.py): one mail per recipient and `interval_s`, listing every
    alert of that interval."""

    kind: Literal["email"]
    host: str
    port: int | None = Field(default=None, ge=1, le=65535, description="Default: 587, 465 or 25 by tls.")
    tls: Literal["starttls", "implicit", "none"] = "starttls"
    ca_file: Path | None = Field(
        default=None, description="CA bundle to verify the server (default: system)."
    )
    username: str | None = None
    password_env: str | None = Field(default=None, description="Environment variable holding the password.")
    sender: str = Field(description="The From address, e.g. 'FleetFence <alerts@example.org>'.")
    recipients: list[str] = Field(min_length=1)
    interval_s: float = Field(
        default=60.0, ge=0, le=3600, description="At most one mail per recipient per interval."
    )
    timeout_s: float = Field(default=10.0, gt=0, le=60)
    max_attempts: int = Field(default=3, ge=1, le=20)
    backoff_initial_ms: int = Field(default=500, ge=0)
    backoff_max_ms: int = Field(default=5_000, ge=0)
    subject: dict[str, str] = Field(
        default_factory=dict, description="Subject template per alert type, or 'default' for the others."
    )
    body: dict[str, str] = Field(
        default_factory=dict, description="Body template per alert type, or 'default' for the others."
    )
    batch_subject: str = DEFAULT_BATCH_SUBJECT

    @field_validator("sender")
    @classmethod
    def _sender(cls, v: str) -> str:
        return _address(v, "sender")

    @field_validator("recipients")
    @classmethod
    def _recipients(cls, v: list[str]) -> list[str]:
        for r in v:
            if "<" in r or "," in r:
                raise ValueError(f"recipient {r!r}: give the bare address (user@domain), one per entry")
            _address(r, "recipient")
        lowered = [r.lower() for r in v]
        if len(set(lowered)) != len(lowered):
            raise ValueError("recipients are repeated")
        return v

    @field_validator("subject", "body")
    @classmethod
    def _templates(cls, v: dict[str, str]) -> dict[str, str]:
        known = {t.value for t in AlertType}
        out: dict[str, str] = {}
        for key, text in v.items():
            name = key if key == "default" else key.upper()
            if name != "default" and name not in known:
                raise ValueError(
                    f"template key {key!r} is neither 'default' nor an alert type {sorted(known)}"
                )
            out[name] = check_template(text, ALERT_FIELDS, f"template {key!r}")
        return out

    @field_validator("batch_subject")
    @classmethod
    def _batch_subject(cls, v: str) -> str:
        return check_template(v, BATCH_FIELDS, "batch_subject")

    @model_validator(mode="after")
    def _consistent(self) -> EmailConfig:
        if self.backoff_max_ms < self.backoff_initial_ms:
            raise ValueError("backoff_max_ms must be >= backoff_initial_ms")
        if (self.username is None) != (self.password_env is None):
            raise ValueError("set both username and password_env, or neither")
        if self.tls == "none" and not _is_loopback(self.host):
            raise ValueError(
                f"tls = 'none' is only allowed to a relay on this host (localhost), not {self.host!r}"
            )
        if self.tls == "none" and self.username is not None:
            raise ValueError("tls = 'none' sends no password: drop username/password_env or use TLS")
        # A flush blocks the receiver while it retries, recipient after recipient; the worst case
        # must stay under the consumer's max.poll.interval.ms or the group would evict it.
        worst_s = len(self.recipients) * self.max_attempts * (self.timeout_s + self.backoff_max_ms / 1000)
        if worst_s > MAX_FLUSH_S:
            raise ValueError(
                f"retry budget recipients*max_attempts*(timeout_s+backoff_max_ms) = {worst_s:.0f}s exceeds "
                f"{MAX_FLUSH_S}s (fewer attempts, a shorter timeout, or a distribution list as recipient)"
            )
        return self

    @property
    def smtp_port(self) -> int:
        return self.port or {"starttls": 587, "implicit": 465, "none": 25}[self.tls]

    def template(self, table: dict[str, str], atype: AlertType, default: str) -> str:
        return table.get(atype.value, table.get("default", default))

    def resolve_password(self) -> str | None:
        if self.password_env is None:
            return None
        value = os.environ.get(self.password_env)
        if not value:
            raise ConfigError(
                f"receiver {self.name!r}: environment variable {self.password_env} (password_env) is not set"
            )
        return value


AnyReceiver = HistoryConfig | MqttConfig | WebhookConfig | EmailConfig
ReceiverConfig = Annotated[AnyReceiver, Field(discriminator="kind")]


class ReceiversFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    receivers: list[ReceiverConfig] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> ReceiversFile:
        names = [r.name for r in self.receivers]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"receiver names must be unique, repeated: {dup}")
        return self

    @property
    def enabled(self) -> list[AnyReceiver]:
        return [r for r in self.receivers if r.enabled]


def _explain(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        lines.append(f"  {loc}: {err['msg']}")
    return "\n".join(lines)


def parse_config(text: str, source: str = "<config>") -> ReceiversFile:
    """Parse TOML text into receivers; ConfigError with every problem listed otherwise."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from exc
    try:
        cfg = ReceiversFile.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{source}: invalid receiver configuration:\n{_explain(exc)}") from exc
    for r in cfg.enabled:
        try:
            r.filter.build()
        except ContractError as exc:  # pragma: no cover - the validator catches it first
            raise ConfigError(f"{source}: receiver {r.name!r}: {exc}") from exc
        if isinstance(r, WebhookConfig):
            r.resolve_secret()
        elif isinstance(r, EmailConfig):
            r.resolve_password()
            if r.ca_file is not None and not r.ca_file.is_file():
                raise ConfigError(f"{source}: receiver {r.name!r}: ca_file {r.ca_file} is not a file")
    return cfg


def load_config(path: Path) -> ReceiversFile:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read receivers config {path}: {exc.strerror}") from exc
    return parse_config(text, str(path))
