#!/bin/bash
# What the official image's bin/kafka-metadata-quorum.sh runs: the controller quorum's state
# (`describe --status` names the active controller, LeaderId).
exec java -Xmx64m -XX:TieredStopAtLevel=1 -Xshare:auto \
  -Dlog4j2.configurationFile=/opt/kafka/config/log4j2.properties \
  -cp '/opt/kafka/libs/*' org.apache.kafka.tools.MetadataQuorumCommand "$@"
