"""Declarative receiver configuration: a TOML file (tomllib) validated by pydantic.

Adding a subscriber is a config change, not code: each `[[receivers]]` table names a receiver,
its kind and its filter. Unknown keys are errors (a typo such as `filtr` must not silently turn a
narrow receiver into one that gets every alert). Secrets are read from a named environment
variable so the file can be committed.
"""

from __future__ import annotations

import os
import re
import tomllib
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


class HistoryConfig(_ReceiverBase):
    kind: Literal["history"]


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


ReceiverConfig = Annotated[HistoryConfig | MqttConfig | WebhookConfig, Field(discriminator="kind")]


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
    def enabled(self) -> list[HistoryConfig | MqttConfig | WebhookConfig]:
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
    return cfg


def load_config(path: Path) -> ReceiversFile:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read receivers config {path}: {exc.strerror}") from exc
    return parse_config(text, str(path))
