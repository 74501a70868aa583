# Local stand-in for node:20-bookworm-slim (deploy/images/README.md): Debian's nodejs (18) and npm,
# enough for the web stage's `npm ci`.
ARG BASE_IMAGE=local/debian:bookworm
FROM ${BASE_IMAGE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends nodejs npm ca-certificates \
    && rm -rf /var/lib/apt/lists/*
CMD ["node"]
