"""Settings, read only through pydantic-settings (environment variables `FLEETFENCE_*`).

One convention for every component: a `settings.py` in its package with a subclass of `Settings`
whose own fields carry the component's name (`gateway_*`, `processor_*`, `alerts_*`, `api_*`,
`master_*`, `simulator_*`, `history_*`), so each is the environment variable `FLEETFENCE_<FIELD>`;
`Settings.from_base` derives one from already-built shared settings.

The embedded defaults bind every service to 127.0.0.1 on ports that do not collide with the
standard ones (a machine may run shared Kafka/MQTT/Redis on 9092/1883/6379). Setting
`FLEETFENCE_KAFKA_BOOTSTRAP`, `FLEETFENCE_MQTT_URL` or `FLEETFENCE_REDIS_URL` switches that
service to an external endpoint: `infra up` then starts nothing for it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar, Self
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, SecretStr, computed_field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from fleetfence.errors import ConfigError
from fleetfence.rules import MAX_EXIT_M, ProcessorRules, ProximityRule, ProximityScope, proximity_rule_set


class TopicNames:
    """Kafka topic names, optionally under a prefix (tests use a unique prefix per test)."""

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix

    @property
    def telemetry(self) -> str:
        return f"{self.prefix}fleet.telemetry"

    @property
    def alerts(self) -> str:
        return f"{self.prefix}fleet.alerts"

    @property
    def telemetry_dlq(self) -> str:
        return f"{self.prefix}fleet.telemetry.dlq"

    @property
    def master(self) -> str:
        return f"{self.prefix}fleet.master"

    @property
    def alerts_dlq(self) -> str:
        return f"{self.prefix}fleet.alerts.dlq"

    @property
    def processor_commits(self) -> str:
        """Markers of the micro-batches whose alerts the processor committed (exactly-once)."""
        return f"{self.prefix}fleet.processor.commits"

    @property
    def processor_shadow(self) -> str:
        """What hot standbys would have committed (processor.spark.hot_sink), for their takeover."""
        return f"{self.prefix}fleet.processor.shadow"


class Settings(BaseSettings):
    """Every knob of FleetFence; see the README's configuration table."""

    model_config = SettingsConfigDict(env_prefix="FLEETFENCE_", extra="ignore")

    state_dir: Path = Field(default=Path(".fleetfence"), description="Folder for all embedded data.")
    # External endpoints: when set, the embedded service is not started.
    kafka_bootstrap: str | None = Field(default=None, description="External Kafka bootstrap.servers.")
    mqtt_url: str | None = Field(default=None, description="External MQTT broker, mqtt://host:port.")
    redis_url: str | None = Field(default=None, description="External Redis, redis://host:port/db.")
    # Embedded service ports (loopback only).
    kafka_port: int = Field(
        default=19092, ge=1, le=65535, description="The embedded Kafka's port (in a cluster, node i's: +i-1)."
    )
    kafka_brokers: int = Field(
        default=1,
        ge=1,
        le=5,
        description="Nodes of the embedded Kafka, each a broker and a KRaft controller voter: 1, or 3 or 5 "
        "(a quorum survives the loss of a minority), for fault tests without Docker.",
    )
    mqtt_port: int = Field(default=11883, ge=1, le=65535)
    redis_port: int = Field(default=16379, ge=1, le=65535)
    host: str = Field(default="127.0.0.1", description="Address embedded services bind to.")
    # MQTT identities (fleetfence.mqtt): every client logs in, Mosquitto checks what each may do.
    mqtt_auth: bool = Field(
        default=True,
        description="Clients log in to MQTT with accounts of their own and Mosquitto's dynamic-security "
        "plugin checks them (the embedded broker loads it); false: anonymous, for a broker without it.",
    )
    mqtt_admin_username: str = Field(default="fleetfence-admin", description="Account managing the plugin.")
    mqtt_admin_password: SecretStr | None = Field(
        default=None, description="Its secret; unset: the embedded broker's, generated at `infra up`."
    )
    mqtt_gateway_username: str = Field(default="fleetfence-gateway", description="The gateways' account.")
    mqtt_gateway_password: SecretStr | None = Field(default=None, description="Its secret (as above).")
    mqtt_alerts_username: str = Field(default="fleetfence-alerts", description="The alert fan-out's account.")
    mqtt_alerts_password: SecretStr | None = Field(default=None, description="Its secret (as above).")
    mqtt_tls_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="The embedded broker's TLS listener for vehicles (the same accounts); unset: none.",
    )
    mqtt_tls_host: str = Field(default="0.0.0.0", description="Address the embedded TLS listener binds to.")
    mqtt_tls_dir: Path | None = Field(
        default=None,
        description="Its ca.crt, server.crt, server.key (`fleetfence mqtt bootstrap --certs-dir`); "
        "unset: <state dir>/mosquitto/certs.",
    )
    # Topics.
    topic_prefix: str = Field(default="", description="Prefix for every Kafka topic name.")
    redis_prefix: str = Field(default="ff:", description="Prefix for every Redis key FleetFence writes.")
    telemetry_partitions: int = Field(default=4, ge=1)
    alerts_partitions: int = Field(default=4, ge=1)
    topic_replication_factor: int = Field(
        default=1,
        ge=1,
        description="Replicas of every topic `infra up` creates: 1 for the embedded single broker, "
        "3 on a cluster of three or more (docker-compose.yml).",
    )
    topic_min_insync_replicas: int = Field(
        default=1,
        ge=1,
        description="`min.insync.replicas` of those topics: with acks=all a write is acknowledged once "
        "this many replicas have it (2 with 3 replicas: one broker may be down, none lost).",
    )
    # Service start-up.
    startup_timeout_s: float = Field(default=30.0, gt=0)
    log_level: str = Field(default="INFO")
    log_json: bool = Field(default=False, description="Log JSON lines instead of key=value lines.")
    # The service registry (fleetfence.registry): how long an announcement outlives its last heartbeat.
    registry_ttl_s: float = Field(
        default=15.0,
        ge=1.0,
        description="TTL of a service's registry key; refreshed every third of it, so a killed service "
        "disappears from `fleetfence status` this long after its last heartbeat.",
    )

    @field_validator("kafka_brokers")
    @classmethod
    def _odd_quorum(cls, n: int) -> int:
        if n % 2 == 0:
            raise ValueError(
                f"kafka_brokers={n}: a KRaft quorum of {n} voters survives no more failures than one of "
                f"{n - 1}; use 1, 3 or 5"
            )
        return n

    @model_validator(mode="after")
    def _cluster_replication(self) -> Self:
        """On an embedded cluster the topics get what docker-compose.yml's cluster gives them (3
        replicas, 2 in sync for a write) unless the variables say otherwise; a single broker and an
        external cluster keep the variables' values (1 and 1 by default)."""
        if self.kafka_brokers > 1 and not self.kafka_external:
            if "topic_replication_factor" not in self.model_fields_set:
                self.topic_replication_factor = min(3, self.kafka_brokers)
            if "topic_min_insync_replicas" not in self.model_fields_set:
                self.topic_min_insync_replicas = 2
        return self

    @classmethod
    def from_base(cls, base: Settings, **overrides: object) -> Self:
        """A component's settings on top of already-built shared settings: the shared fields from
        `base`, the component's own (`FLEETFENCE_<COMPONENT>_*`) from the environment, then
        `overrides`. The one way to derive them: the CLI passes the environment's shared settings,
        tests pass their fixtures' (a private broker, a unique topic prefix)."""
        own = cls()
        values = {k: getattr(own, k) for k in cls.model_fields if k not in Settings.model_fields}
        values.update({k: getattr(base, k) for k in Settings.model_fields})
        values.update(overrides)
        return cls.model_validate(values)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def topics(self) -> TopicNames:
        # Not cached: `model_copy(update={"topic_prefix": ...})` must not keep the old names.
        return TopicNames(self.topic_prefix)

    @property
    def kafka_external(self) -> bool:
        return self.kafka_bootstrap is not None

    @property
    def mqtt_external(self) -> bool:
        return self.mqtt_url is not None

    @property
    def redis_external(self) -> bool:
        return self.redis_url is not None

    @property
    def kafka_ports(self) -> list[int]:
        """The embedded Kafka nodes' ports: FLEETFENCE_KAFKA_PORT and the next ones in a cluster."""
        return [self.kafka_port + i for i in range(self.kafka_brokers)]

    @property
    def bootstrap_servers(self) -> str:
        return self.kafka_bootstrap or ",".join(f"{self.host}:{port}" for port in self.kafka_ports)

    @property
    def mqtt_host_port(self) -> tuple[str, int]:
        if self.mqtt_url is None:
            return self.host, self.mqtt_port
        parsed = urlparse(self.mqtt_url)
        if parsed.scheme not in ("mqtt", "tcp") or not parsed.hostname:
            raise ConfigError(f"FLEETFENCE_MQTT_URL must look like mqtt://host:port, got {self.mqtt_url!r}")
        return parsed.hostname, parsed.port or 1883

    @property
    def redis_dsn(self) -> str:
        return self.redis_url or f"redis://{self.host}:{self.redis_port}/0"

    @property
    def kafka_dir(self) -> Path:
        return self.state_dir / "kafka"

    @property
    def mqtt_dir(self) -> Path:
        return self.state_dir / "mosquitto"

    @property
    def redis_dir(self) -> Path:
        return self.state_dir / "redis"

    @property
    def run_dir(self) -> Path:
        return self.state_dir / "run"


# The id of the fleet-wide proximity rule the variables give (in each pair alert's id).
FLEET_PROXIMITY_RULE_ID = "fleet"
# A proximity rule's durations (seconds) unless it sets them: the fleet's variables' defaults too.
PROXIMITY_MIN_DURATION_S, PROXIMITY_TOLERANCE_S, PROXIMITY_LOST_AFTER_S = 30.0, 5.0, 120.0


class ProximityRuleSpec(BaseModel):
    """A proximity rule as configured (`FLEETFENCE_PROCESSOR_PROXIMITY_RULES`, a JSON list of
    these): for the fleet, or for the vehicles of one route (`route_id`) or of one fleet group
    (`group`, the vehicle attribute `group`). Durations in seconds, as the single rule's variables."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rule_id: str  # checked by the rule (`PROXIMITY_RULE_ID_RE`)
    enter_m: float = Field(gt=0)
    exit_m: float = Field(gt=0, le=MAX_EXIT_M)
    min_duration_s: float = Field(default=PROXIMITY_MIN_DURATION_S, ge=0)
    tolerance_s: float = Field(default=PROXIMITY_TOLERANCE_S, ge=0)
    lost_after_s: float = Field(default=PROXIMITY_LOST_AFTER_S, gt=0)
    route_id: str | None = Field(default=None, min_length=1)
    group: str | None = Field(default=None, min_length=1)

    def rule(self) -> ProximityRule:
        """The rule; a contradictory one raises ValueError in the rule's own words."""
        return ProximityRule(
            rule_id=self.rule_id,
            enter_m=self.enter_m,
            exit_m=self.exit_m,
            min_duration_ms=round(self.min_duration_s * 1000),
            tolerance_ms=round(self.tolerance_s * 1000),
            lost_after_ms=round(self.lost_after_s * 1000),
            scope=ProximityScope(route_id=self.route_id, group=self.group),
        )

    @staticmethod
    def of(rule: ProximityRule) -> ProximityRuleSpec:
        return ProximityRuleSpec(
            rule_id=rule.rule_id,
            enter_m=rule.enter_m,
            exit_m=rule.exit_m,
            min_duration_s=rule.min_duration_ms / 1000,
            tolerance_s=rule.tolerance_ms / 1000,
            lost_after_s=rule.lost_after_ms / 1000,
            route_id=rule.scope.route_id,
            group=rule.scope.group,
        )


class ProcessorRulesSettings(Settings):
    """The processor-wide rules as `FLEETFENCE_PROCESSOR_*` variables, with `ProcessorRules`' defaults.

    Read by the processor, which applies them, and by the simulator, whose ground truth must assume
    what the processor applies: both settings classes derive from this one, so a deployment that
    sets a variable changes both sides, and `processor_rules` is the one reading of them.
    """

    processor_lateness_s: float = Field(
        default=ProcessorRules.lateness_ms / 1000, ge=0, description="Allowed event-time lateness."
    )
    processor_late_bound_s: float = Field(
        default=ProcessorRules.late_bound_ms / 1000,
        gt=0,
        description="How far behind the watermark a fix may arrive and still be applied (stored and "
        "forwarded by a tracker out of coverage); beyond it: a dead letter with reason `late`.",
    )
    processor_hysteresis_m: float = Field(default=ProcessorRules.hysteresis_m, ge=0)
    processor_return_min_fixes: int = Field(default=ProcessorRules.return_min_fixes, ge=1)
    processor_overspeed_hysteresis_kmh: float = Field(default=ProcessorRules.overspeed_hysteresis_kmh, ge=0)
    processor_silent_after_s: float = Field(
        default=ProcessorRules.default_silent_after_s, gt=0, description="Default when a route has none."
    )
    processor_stop_hysteresis_kmh: float = Field(
        default=ProcessorRules.stop_hysteresis_kmh,
        ge=0,
        description="A confirmed stop ends this far above the stop speed.",
    )
    processor_arrival_hysteresis_s: float = Field(
        default=ProcessorRules.arrival_hysteresis_s,
        ge=0,
        description="A trip at risk is back on time this far below the route's arrival threshold.",
    )
    processor_eta_warmup_s: float = Field(
        default=ProcessorRules.eta_warmup_s, ge=0, description="No ETA before a trip has run this long."
    )
    processor_eta_min_speed_kmh: float = Field(
        default=ProcessorRules.eta_min_speed_kmh,
        gt=0,
        description="The slowest average speed an ETA assumes.",
    )

    # Vehicle proximity (processor.core.proximity): a fleet-wide rule, off unless its distances are
    # set, and any rules per route or fleet group (`processor_proximity_rules`); the simulator's
    # truth assumes them too (simulator.truth_proximity).
    processor_proximity_enter_m: float | None = Field(
        default=None,
        gt=0,
        description="PROXIMITY_ENTER when two vehicles stay within this many metres for "
        "processor_proximity_min_duration_s; unset: no proximity query.",
    )
    processor_proximity_exit_m: float | None = Field(
        default=None,
        gt=0,
        le=MAX_EXIT_M,
        description="PROXIMITY_EXIT beyond this many metres (more than the enter distance: the "
        "hysteresis band); unset: twice the enter distance.",
    )
    processor_proximity_min_duration_s: float = Field(
        default=PROXIMITY_MIN_DURATION_S,
        ge=0,
        description="How long two vehicles stay near before PROXIMITY_ENTER.",
    )
    processor_proximity_tolerance_s: float = Field(
        default=PROXIMITY_TOLERANCE_S,
        ge=0,
        description="Two fixes of two vehicles at most this far apart in event time are compared "
        "(the simulator's truth needs it shorter than a fix period: 0.5 at 1 Hz).",
    )
    processor_proximity_lost_after_s: float = Field(
        default=PROXIMITY_LOST_AFTER_S,
        gt=0,
        description="PROXIMITY_EXIT (reason lost) after this long without a meeting.",
    )
    processor_proximity_rules: list[ProximityRuleSpec] = Field(
        default_factory=list,
        description="More proximity rules, a JSON list: each with its rule_id, enter_m, exit_m, "
        "optionally min_duration_s, tolerance_s, lost_after_s, and route_id (the vehicles "
        "assigned to that route) or group (the vehicles whose attribute `group` is that); "
        "neither: the whole fleet.",
    )

    def processor_rules(self) -> ProcessorRules:
        return ProcessorRules(
            hysteresis_m=self.processor_hysteresis_m,
            return_min_fixes=self.processor_return_min_fixes,
            overspeed_hysteresis_kmh=self.processor_overspeed_hysteresis_kmh,
            lateness_ms=int(self.processor_lateness_s * 1000),
            late_bound_ms=int(self.processor_late_bound_s * 1000),
            default_silent_after_s=self.processor_silent_after_s,
            stop_hysteresis_kmh=self.processor_stop_hysteresis_kmh,
            arrival_hysteresis_s=self.processor_arrival_hysteresis_s,
            eta_warmup_s=self.processor_eta_warmup_s,
            eta_min_speed_kmh=self.processor_eta_min_speed_kmh,
        )

    @model_validator(mode="after")
    def _proximity_rule_holds(self) -> ProcessorRulesSettings:
        if self.processor_proximity_enter_m is None and self.processor_proximity_exit_m is not None:
            raise ValueError("FLEETFENCE_PROCESSOR_PROXIMITY_EXIT_M needs the enter distance too")
        self.proximity_rules()  # a contradictory rule fails at start-up, with the rule's own words
        return self

    @staticmethod
    def proximity_env(rules: tuple[ProximityRule, ...]) -> dict[str, str]:
        """The variables that give a processor `rules`: what a launcher hands the processor it
        starts. The fleet's rule (id FLEET_PROXIMITY_RULE_ID, whole fleet) in its own variables, every
        other in FLEETFENCE_PROCESSOR_PROXIMITY_RULES (set even when empty, so that an inherited list
        does not add to them)."""
        env: dict[str, str] = {}
        others = []
        for rule in rules:
            if rule.rule_id == FLEET_PROXIMITY_RULE_ID and rule.scope.fleet:
                env |= {
                    "FLEETFENCE_PROCESSOR_PROXIMITY_ENTER_M": str(rule.enter_m),
                    "FLEETFENCE_PROCESSOR_PROXIMITY_EXIT_M": str(rule.exit_m),
                    "FLEETFENCE_PROCESSOR_PROXIMITY_MIN_DURATION_S": str(rule.min_duration_ms / 1000),
                    "FLEETFENCE_PROCESSOR_PROXIMITY_TOLERANCE_S": str(rule.tolerance_ms / 1000),
                    "FLEETFENCE_PROCESSOR_PROXIMITY_LOST_AFTER_S": str(rule.lost_after_ms / 1000),
                }
            else:
                others.append(ProximityRuleSpec.of(rule).model_dump(exclude_none=True))
        env["FLEETFENCE_PROCESSOR_PROXIMITY_RULES"] = json.dumps(others)
        return env

    # Every variable that gives a proximity rule: a launcher that hands a processor its own rules
    # (`proximity_env`) unsets the rest, so that none is inherited from its own environment.
    PROXIMITY_RULE_VARIABLES: ClassVar[tuple[str, ...]] = tuple(
        f"FLEETFENCE_PROCESSOR_PROXIMITY_{v}"
        for v in ("ENTER_M", "EXIT_M", "MIN_DURATION_S", "TOLERANCE_S", "LOST_AFTER_S", "RULES")
    )

    def proximity_rules(self) -> tuple[ProximityRule, ...]:
        """Every proximity rule the processor runs (empty: proximity off): the fleet's
        (`proximity_rule`) first, then `processor_proximity_rules`; contradictory ones and repeated
        ids raise ValueError."""
        fleet = self.proximity_rule()
        listed = tuple(spec.rule() for spec in self.processor_proximity_rules)
        return proximity_rule_set(((fleet,) if fleet else ()) + listed)

    def proximity_rule(self) -> ProximityRule | None:
        """The fleet's proximity rule (None: proximity off); a contradictory one raises ValueError."""
        enter = self.processor_proximity_enter_m
        if enter is None:
            return None
        return ProximityRuleSpec(
            rule_id=FLEET_PROXIMITY_RULE_ID,
            enter_m=enter,
            exit_m=self.processor_proximity_exit_m or 2 * enter,
            min_duration_s=self.processor_proximity_min_duration_s,
            tolerance_s=self.processor_proximity_tolerance_s,
            lost_after_s=self.processor_proximity_lost_after_s,
        ).rule()


def get_settings() -> Settings:
    """Fresh settings from the environment (no global cache: tests change the environment)."""
    return Settings()
