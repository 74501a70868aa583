"""One exception hierarchy for the whole distribution.

Every error FleetFence raises on purpose derives from `FleetFenceError`, so a CLI or a service
loop can tell "our own, explained failure" (print the message, exit non-zero) from a bug.
"""

from __future__ import annotations


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
