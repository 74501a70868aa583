# Local stand-in for eclipse-mosquitto:2.0.x (deploy/images/README.md): Debian's mosquitto 2.0, the
# broker's user at uid/gid 1883 as in the official image, the dynamic-security plugin where the
# official image has it, the config read from /mosquitto/config/mosquitto.conf.
ARG BASE_IMAGE=local/debian:bookworm
FROM ${BASE_IMAGE}
RUN groupadd --system --gid 1883 mosquitto \
    && useradd --system --uid 1883 --gid mosquitto --home-dir /mosquitto --no-create-home mosquitto \
    && apt-get update \
    && apt-get install -y --no-install-recommends mosquitto mosquitto-clients \
    && rm -rf /var/lib/apt/lists/* \
    && ln -s "$(find /usr/lib -name mosquitto_dynamic_security.so | head -n1)" /usr/lib/mosquitto_dynamic_security.so \
    && mkdir -p /mosquitto/config /mosquitto/data /mosquitto/log /mosquitto/certs \
    && chown -R mosquitto:mosquitto /mosquitto
EXPOSE 1883
# Started as root, the broker switches to the `mosquitto` user (as the official image's does).
CMD ["/usr/sbin/mosquitto", "-c", "/mosquitto/config/mosquitto.conf"]
