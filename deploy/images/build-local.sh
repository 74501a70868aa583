#!/usr/bin/env bash
# Local stand-ins for the public images docker-compose.yml pulls, for machines that reach no
# container registry (only Debian's mirror, PyPI, npm and Maven Central):
#
#   bash deploy/images/build-local.sh            # builds what is missing, prints the overrides
#   set -a; . deploy/images/local.env; set +a     # then: docker-compose up -d --build
#
# Everything is built FROM a Debian bookworm base made with debootstrap from the mirror apt already
# uses and `docker import`ed as local/debian:bookworm. What each stand-in is, and where it differs
# from the official image, is in deploy/images/README.md. Grafana is not built: it is neither in
# Debian nor buildable offline (run without the grafana service). Docker's layer cache makes a
# second run take seconds.
set -euo pipefail
cd "$(dirname "$0")/../.."
here=deploy/images
base="${FLEETFENCE_BASE_IMAGE:-local/debian:bookworm}"
kafka_version="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' fleetfence/jvm/kafka/pom.xml)"

mirror() {
  # The Debian mirror apt uses here (deb822 or one-line sources), else deb.debian.org.
  local m
  m="$(grep -hsE '^(URIs:|deb )' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
        | grep -v security | sed -E 's/^URIs:[[:space:]]*//; s/^deb[[:space:]]+(\[[^]]*\][[:space:]]+)?//' \
        | awk '{print $1}' | head -n1 || true)"
  echo "${m:-http://deb.debian.org/debian}"
}

rootfs_image="${base}-rootfs"
if ! docker image inspect "$rootfs_image" >/dev/null 2>&1; then
  command -v debootstrap >/dev/null || { echo "debootstrap is needed: apt-get install -y debootstrap" >&2; exit 1; }
  root="$(mktemp -d "${TMPDIR:-/tmp}/fleetfence-rootfs.XXXXXX")"
  trap 'rm -rf "$root"' EXIT
  m="$(mirror)"
  echo "base image: debootstrap --variant=minbase bookworm from $m" >&2
  debootstrap --variant=minbase bookworm "$root" "$m" >/dev/null
  sec="${m%/debian}/debian-security"
  printf 'deb %s bookworm main\ndeb %s bookworm-updates main\ndeb %s bookworm-security main\n' "$m" "$m" "$sec" \
    > "$root/etc/apt/sources.list"
  chroot "$root" apt-get clean
  rm -rf "$root"/var/lib/apt/lists/*
  tar -C "$root" -c . | docker import - "$rootfs_image" >/dev/null
  rm -rf "$root"
  trap - EXIT
fi

# The CAs this host trusts beyond Debian's bundle (FLEETFENCE_EXTRA_CA_CERTS: PEM files, space
# separated; default: the locally added ones, /usr/local/share/ca-certificates and the regular
# files in /etc/ssl/certs), one certificate a file, for base.Dockerfile.
ca_dir="$here/extra-ca"
rm -rf "$ca_dir" && mkdir -p "$ca_dir"
if [ -n "${FLEETFENCE_EXTRA_CA_CERTS+set}" ]; then
  cas="$FLEETFENCE_EXTRA_CA_CERTS"
else
  cas="$(find /usr/local/share/ca-certificates -type f -name '*.crt' 2>/dev/null; \
         find /etc/ssl/certs -maxdepth 1 -type f \( -name '*.pem' -o -name '*.crt' \) \
           ! -name ca-certificates.crt ! -name 'ssl-cert-snakeoil.pem' 2>/dev/null)"
fi
i=0
for f in $cas; do
  if openssl x509 -in "$f" -noout 2>/dev/null; then
    i=$((i + 1)); openssl x509 -in "$f" -out "$ca_dir/host-$i.crt"
  fi
done
echo "base image: $i extra CA certificate(s) from this host" >&2
docker build -q --build-arg "ROOTFS_IMAGE=$rootfs_image" -t "$base" -f "$here/base.Dockerfile" "$here" >/dev/null

build() {  # tag dockerfile
  echo "building $1" >&2
  docker build -q --build-arg "BASE_IMAGE=$base" -t "$1" -f "$here/$2" . >/dev/null
}
build local/python:3.11-bookworm python.Dockerfile
build local/node:bookworm node.Dockerfile
build "local/kafka:$kafka_version" kafka.Dockerfile
build local/mosquitto:2.0-bookworm mosquitto.Dockerfile
build local/redis:7.0-bookworm redis.Dockerfile
build local/prometheus:2-bookworm prometheus.Dockerfile

cat > "$here/local.env" <<ENV
# Written by deploy/images/build-local.sh: docker-compose.yml's image overrides for the local stand-ins.
FLEETFENCE_PYTHON_IMAGE=local/python:3.11-bookworm
FLEETFENCE_NODE_IMAGE=local/node:bookworm
FLEETFENCE_KAFKA_IMAGE=local/kafka:$kafka_version
FLEETFENCE_MOSQUITTO_IMAGE=local/mosquitto:2.0-bookworm
FLEETFENCE_REDIS_IMAGE=local/redis:7.0-bookworm
FLEETFENCE_PROMETHEUS_IMAGE=local/prometheus:2-bookworm
ENV
cat "$here/local.env"
