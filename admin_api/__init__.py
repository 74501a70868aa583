"""FleetFence admin_api."""
