"""FleetFence's ground: wire contracts and telemetry validity, settings, the one exception tree,
the Kafka client helpers, the JVM jar cache, the embedded infrastructure and the helpers tests and
benchmarks share.

Every component (gateway, processor, vehicle_master, alerts, admin_api, simulator, history) depends
on this package, and it imports none of them (tests/ground/test_layers.py holds it to that); the command
line that composes them is the `cli` package on top.
"""

__version__ = "0.1.0"
