"""Launchers of the embedded infrastructure (Apache Kafka, Mosquitto, Redis) and of a local Spark
standalone cluster: the top layer, beside the CLI. Components never import it; they only see
endpoints in their settings (docs/architecture.md "Layers")."""
