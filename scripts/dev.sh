#!/usr/bin/env bash
# FleetFence's one entry point for a fresh Debian/Ubuntu machine:
#   bash scripts/dev.sh demo   -> the live demo on the embedded infrastructure
#   bash scripts/dev.sh test   -> the default test suite (extra arguments go to pytest)
# It installs what is missing (mosquitto, redis, a Java 17 runtime, Maven, kcat, chromium and npm;
# a virtualenv with the project and its dev extra; the JVM jars of the embedded Kafka broker and of
# Spark's Kafka connector, fetched by Maven once into ~/.cache/fleetfence/jars; the map's npm packages
# in web/node_modules) and only what is missing, so a second run starts at once.
set -euo pipefail
cd "$(dirname "$0")/.."

cmd="${1:-}"
shift || true

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

need=()
{ command -v mosquitto >/dev/null || [ -x /usr/sbin/mosquitto ]; } || need+=(mosquitto)
command -v mosquitto_pub >/dev/null || need+=(mosquitto-clients)
{ command -v redis-server >/dev/null || [ -x /usr/bin/redis-server ]; } || need+=(redis-server)
command -v redis-cli >/dev/null || need+=(redis-tools)
if ! command -v java >/dev/null || ! java -version 2>&1 | grep -qE 'version "(17|21)'; then
  need+=(openjdk-17-jre-headless)
fi
# Maven fetches the JVM jars once (`fleetfence infra jars`); kcat inspects the embedded broker.
command -v mvn >/dev/null || need+=(maven)
command -v kcat >/dev/null || need+=(kcat)
# The live map: its front-end libraries come from npm; its browser tests drive Debian's chromium.
{ command -v chromium >/dev/null || [ -x /usr/bin/chromium ]; } || need+=(chromium)
command -v npm >/dev/null || need+=(nodejs npm)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing system packages: ${need[*]}" >&2
  as_root apt-get update -q
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}"
fi

PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
  .venv/bin/pip install -q --upgrade pip
fi
stamp=.venv/.fleetfence-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/pip install -q -e '.[dev,bench,charts]'
  touch "$stamp"
fi
# The embedded Kafka broker's jars and Spark's Kafka connector: a no-op once they are in the cache.
.venv/bin/fleetfence infra jars >/dev/null
web_stamp=web/node_modules/.fleetfence-installed
if [ ! -f "$web_stamp" ] || [ web/package-lock.json -nt "$web_stamp" ]; then
  npm ci --prefix web --no-audit --no-fund
  touch "$web_stamp"
fi
export PATH="$PWD/.venv/bin:$PATH"
export PYSPARK_PYTHON="$PWD/.venv/bin/python"
export PYSPARK_DRIVER_PYTHON="$PWD/.venv/bin/python"

case "$cmd" in
  demo) exec fleetfence demo "$@" ;;
  test) exec python -m pytest "$@" ;;
  # The tests that SIGKILL or freeze Spark drivers at random moments of a live stream, and kill or stop
  # the brokers under load (marker `fault`, left out of the default run): the fault suite, on the
  # embedded infrastructure, no Docker.
  # Narrow it with -k: an -m of your own replaces `fault`.
  fault-test) exec python -m pytest -m fault "$@" ;;
  lint) ruff check . && ruff format --check . && mypy ;;
  # The compose deployment built and run for real, with its faults (tests_deploy/): needs root, and
  # installs Docker and debootstrap from apt when missing; builds local stand-ins for the public images.
  deploy-test)
    need=()
    command -v dockerd >/dev/null || need+=(docker.io)
    command -v docker-compose >/dev/null || need+=(docker-compose)
    command -v debootstrap >/dev/null || need+=(debootstrap)
    # Go builds toxiproxy for the suite (tests_deploy/harness.py); the machine's own Go if it has one.
    command -v go >/dev/null || [ -x /usr/local/go/bin/go ] || need+=(golang-go)
    if [ ${#need[@]} -gt 0 ]; then
      as_root apt-get update -q
      as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}"
    fi
    exec python -m pytest -p no:cacheprovider -s tests_deploy "$@" ;;
  *) echo "usage: bash scripts/dev.sh demo|test|lint|fault-test|deploy-test [args]" >&2; exit 2 ;;
esac
