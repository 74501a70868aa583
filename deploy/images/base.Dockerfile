# The local base every stand-in and (through the python stand-in) every FleetFence image is built
# FROM: Debian bookworm from debootstrap, plus the certificate authorities this host trusts beyond
# Debian's own (a TLS-inspecting proxy's, a company CA): without them pip, npm and Maven inside the
# builds cannot reach PyPI, npm and Maven Central from such a network. build-local.sh gathers them
# into ./extra-ca (not committed); an empty folder adds none.
ARG ROOTFS_IMAGE=local/debian:bookworm-rootfs
FROM ${ROOTFS_IMAGE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY extra-ca/ /usr/local/share/ca-certificates/extra/
RUN update-ca-certificates
# pip and node read their own CA lists unless told otherwise: point them at the system's.
ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt \
    REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt
