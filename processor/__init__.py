"""FleetFence processor."""
