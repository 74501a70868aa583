"""FleetFence gateway: the only door from MQTT into Kafka.

`gateway.core` decides (pure), `gateway.inflight` tracks what waits for Kafka (pure),
`gateway.service.Gateway` does the I/O; run it with `fleetfence gateway` or `python -m gateway`.
"""
