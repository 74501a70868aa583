"""FleetFence alerts."""
