"""Settings of the vehicle master and its outbox relay (FLEETFENCE_RELAY_*)."""

from __future__ import annotations

from pydantic import Field

from fleetfence.settings import Settings


class MasterSettings(Settings):
    """FleetFence settings plus the relay's knobs."""

    relay_batch_size: int = Field(
        default=500, ge=1, le=100_000, description="Outbox entries per Kafka flush."
    )
    relay_lease_ms: int = Field(
        default=10_000, ge=500, description="Relay leadership lease: one relay publishes at a time."
    )
    relay_block_ms: int = Field(
        default=1_000, ge=10, le=60_000, description="How long an idle relay waits on the outbox stream."
    )
