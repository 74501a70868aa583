"""FleetFence gateway: the only door from MQTT into Kafka.

`gateway.core` decides (pure), `gateway.inflight` tracks what waits for Kafka (pure),
`gateway.producer` gets records into Kafka, `gateway.acks` sends PUBACKs only after that,
`gateway.mqtt_client` is the one adapter over paho's internals, and `gateway.service.Gateway`
runs them on one I/O thread; run it with `fleetfence gateway` or `python -m gateway`.
"""
