#!/bin/bash
# What the official image's bin/kafka-broker-api-versions.sh runs (the compose health check).
exec java -Xmx64m -XX:TieredStopAtLevel=1 -Xshare:auto \
  -Dlog4j2.configurationFile=/opt/kafka/config/log4j2.properties \
  -cp '/opt/kafka/libs/*' org.apache.kafka.tools.BrokerApiVersionsCommand "$@"
