"""FleetFence vehicle_master."""
