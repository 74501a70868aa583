"""`fleetfence loadtest`: the whole pipeline (MQTT -> gateway replicas -> Kafka -> processor ->
alert receivers) driven by simulated vehicles with ground truth, measured stage by stage."""
