# Local stand-in for apache/kafka (deploy/images/README.md): the same Apache Kafka jars as the
# embedded broker (fleetfence/jvm/kafka/pom.xml, fetched from Maven Central at build time), and an
# entrypoint that reads the official image's KAFKA_* / CLUSTER_ID environment.
ARG BASE_IMAGE=local/debian:bookworm
FROM ${BASE_IMAGE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless maven \
    && rm -rf /var/lib/apt/lists/*
COPY fleetfence/jvm/kafka/pom.xml /tmp/kafka-pom/pom.xml
# The broker's jars (the embedded broker's pom), and kafka-tools for the two tools the deployment
# uses: kafka-broker-api-versions.sh (the health check) and kafka-metadata-quorum.sh (the
# deployment suite finds the active controller); the official image ships every tool.
RUN mvn -q -B -f /tmp/kafka-pom/pom.xml dependency:copy-dependencies -DoutputDirectory=/opt/kafka/libs \
    && version=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' /tmp/kafka-pom/pom.xml) \
    && mvn -q -B org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy -Dartifact=org.apache.kafka:kafka-tools:${version} -DoutputDirectory=/opt/kafka/libs \
    && rm -rf /root/.m2 /tmp/kafka-pom \
    && apt-get purge -y maven && apt-get autoremove -y
COPY deploy/images/kafka-run /opt/kafka/docker/run
COPY deploy/images/kafka-broker-api-versions.sh /opt/kafka/bin/kafka-broker-api-versions.sh
COPY deploy/images/kafka-metadata-quorum.sh /opt/kafka/bin/kafka-metadata-quorum.sh
RUN chmod 0755 /opt/kafka/docker/run /opt/kafka/bin/kafka-broker-api-versions.sh \
        /opt/kafka/bin/kafka-metadata-quorum.sh \
    && groupadd --system --gid 1000 appuser \
    && useradd --system --uid 1000 --gid appuser --home-dir /opt/kafka appuser \
    && mkdir -p /var/lib/kafka/data /opt/kafka/config \
    && chown -R appuser:appuser /var/lib/kafka /opt/kafka/config
USER appuser
EXPOSE 9092
ENTRYPOINT ["/opt/kafka/docker/run"]
