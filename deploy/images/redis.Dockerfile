# Local stand-in for redis:7.x (deploy/images/README.md): Debian's redis-server (7.0), data in
# /data as in the official image, run as the `redis` user.
ARG BASE_IMAGE=local/debian:bookworm
FROM ${BASE_IMAGE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends redis-server redis-tools \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /data && chown redis:redis /data
# The official image is built with protected mode off (it listens on every interface of the container
# without a password); Debian's binary has it on: the entrypoint turns it off.
RUN printf '#!/bin/sh\nif [ "$1" = redis-server ]; then shift; exec redis-server "$@" --protected-mode no; fi\nexec "$@"\n' \
      > /usr/local/bin/redis-entrypoint && chmod 0755 /usr/local/bin/redis-entrypoint
WORKDIR /data
USER redis
EXPOSE 6379
ENTRYPOINT ["/usr/local/bin/redis-entrypoint"]
CMD ["redis-server"]
