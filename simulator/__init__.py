"""FleetFence simulator."""
