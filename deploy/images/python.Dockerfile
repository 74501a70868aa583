# Local stand-in for python:3.11-slim-bookworm (deploy/images/README.md): Debian's Python 3.11
# (at /usr/bin instead of /usr/local/bin; `python` is python3), with venv and pip.
ARG BASE_IMAGE=local/debian:bookworm
FROM ${BASE_IMAGE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python-is-python3 ca-certificates \
    && rm -rf /var/lib/apt/lists/*
CMD ["python3"]
