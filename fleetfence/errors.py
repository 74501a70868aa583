"""One exception hierarchy for the whole distribution.

Every error FleetFence raises on purpose derives from `FleetFenceError`, so a CLI or a service
loop can tell "our own, explained failure" (print the message, exit non-zero) from a bug.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


class FleetFenceError(Exception):
    """Base of every error FleetFence raises on purpose."""


class ConfigError(FleetFenceError):
    """Settings are inconsistent or point at something that does not exist."""


class PortInUseError(ConfigError):
    """An explicitly configured port (a service's metrics endpoint) is taken by another process."""


class InfraError(FleetFenceError):
    """Embedded infrastructure could not be started, reached or stopped."""


class MissingBinaryError(InfraError):
    """A server binary (mosquitto, redis-server, java, mvn) is not installed."""


class StandaloneError(InfraError):
    """A local Spark standalone master or worker (`embedded.spark_cluster`) did not come up."""


class ServiceUnavailableError(InfraError):
    """A service did not answer a protocol round trip before its deadline."""


class ServiceExitedError(ServiceUnavailableError):
    """A service process that its caller started and counts on (one of `embedded.pipeline`'s: the
    admin API, the processor, a gateway, the receivers) has exited. Why it did is in its own log,
    which the person reading the error often does not have at hand (a CI job's artefacts, a run
    folder on another machine), so the message names the service, says how it ended (exit code or
    signal) and carries the log's last lines and path. `service`, `returncode` and `log` are there
    for code that reacts to it."""

    def __init__(self, message: str, *, service: str, returncode: int, log: Path) -> None:
        super().__init__(message)
        self.service = service
        self.returncode = returncode
        self.log = log


class KafkaUnavailableError(InfraError):
    """A Kafka read (offsets, watermarks, metadata) got no answer before its deadline, or its
    caller stopped waiting: the brokers it needs were unreachable the whole time (a host name that
    does not resolve, refused connections, every broker down, requests timing out) or a
    partition's leader kept moving (`fleetfence.kafka.through_outage`). `error` is librdkafka's
    last answer (a KafkaError); `stopped` is True when the caller's service was stopping rather
    than a deadline passing."""

    def __init__(self, message: str, error: Any = None, *, stopped: bool = False) -> None:
        super().__init__(message)
        self.error: Any = error  # confluent_kafka.KafkaError: the ground's errors import no client
        self.stopped = stopped


class MqttControlError(FleetFenceError):
    """Mosquitto's dynamic-security plugin refused a command (an account, role or password
    change); the message carries the plugin's own error."""


class ContractError(FleetFenceError):
    """A message does not satisfy its wire contract.

    `reason` is a short machine-readable code (it becomes the dead-letter reason); the message is
    the human explanation.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class KafkaDeliveryError(FleetFenceError):
    """Kafka refused or failed to deliver a record, or a transaction could not commit."""


class LifecycleError(FleetFenceError, RuntimeError):
    """An object was used out of its life cycle (started twice): a bug in the caller."""


class WaitTimeoutError(FleetFenceError, AssertionError):
    """A condition did not become true before its deadline (`fleetfence.testing.wait_for`; an
    AssertionError, so a test fails on it rather than erroring)."""
