"""FleetFence's shared package: the `fleetfence` CLI, settings, wire contracts, errors,
embedded infrastructure and the Kafka/MQTT client helpers every component uses.

Components (gateway, processor, vehicle_master, alerts, admin_api, simulator) depend on this
package and never on each other's internals, so each can be deployed on its own.
"""

__version__ = "0.1.0"
