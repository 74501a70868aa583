"""FleetFence gateway."""
