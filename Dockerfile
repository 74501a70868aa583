# syntax=docker/dockerfile:1
# FleetFence images, one target per service:
#   docker build --target gateway   -t fleetfence-gateway .
#   docker build --target api       -t fleetfence-api .
#   docker build --target alerts    -t fleetfence-alerts .
#   docker build --target processor -t fleetfence-processor .   (Java 17: the Spark driver)
#   docker build --target spark     -t fleetfence-spark .       (Java 17: Spark master/worker/executors)
# pyspark from PyPI ships Spark itself (jars and bin/spark-class), so the processor and the Spark
# cluster run the same Spark and the same Python packages (executors import processor.*). Spark's
# Kafka connector is not in pyspark: the jars stage fetches it with Maven from the same pom and into
# the same cache layout as `fleetfence infra jars` on a developer machine, and the Java images carry
# that cache (FLEETFENCE_JAR_CACHE), so they start offline.

# The public base images, overridable (docker-compose.yml passes FLEETFENCE_PYTHON_IMAGE and
# FLEETFENCE_NODE_IMAGE; deploy/images/build-local.sh builds stand-ins where no registry is reachable).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG NODE_IMAGE=node:20-bookworm-slim

# ---------------------------------------------------------------- build: the virtualenv
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
WORKDIR /src
COPY pyproject.toml ./
# The dependencies first, in a layer of their own: a change to FleetFence's code rebuilds only the
# layers from here on (seconds), not pyspark and the rest (minutes).
RUN /opt/venv/bin/python -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies'], sep='\\n')" > /tmp/requirements.txt \
    && /opt/venv/bin/pip install -r /tmp/requirements.txt
COPY README.md ./
COPY cli ./cli
COPY embedded ./embedded
COPY fleetfence ./fleetfence
COPY gateway ./gateway
COPY processor ./processor
COPY vehicle_master ./vehicle_master
COPY alerts ./alerts
COPY admin_api ./admin_api
COPY simulator ./simulator
COPY history ./history
COPY loadtest ./loadtest
RUN /opt/venv/bin/pip install --no-deps . \
    && chmod 0755 /opt/venv/lib/python3.11/site-packages/pyspark/bin/*

# ---------------------------------------------------------------- jars: Spark's Kafka connector
# `fleetfence infra jars spark` runs Maven on the installed package's fleetfence/jvm/spark/pom.xml and
# keeps the jars in $FLEETFENCE_JAR_CACHE/spark-<pom hash>/libs (marked complete), where every
# SparkSession of the processor and the archive looks for them (spark.jars).
FROM build AS jars
RUN apt-get update \
    && apt-get install -y --no-install-recommends maven \
    && rm -rf /var/lib/apt/lists/*
ENV FLEETFENCE_JAR_CACHE=/opt/fleetfence-jars
RUN /opt/venv/bin/fleetfence infra jars spark \
    && chmod -R a+rX /opt/fleetfence-jars \
    && rm -rf /root/.m2

# ---------------------------------------------------------------- web: the live map's npm packages
# Leaflet and Geoman, pinned by web/package-lock.json; the api image serves them at /static/vendor.
FROM ${NODE_IMAGE} AS web
WORKDIR /web
COPY web/package.json web/package-lock.json ./
RUN npm ci --no-audit --no-fund

# ---------------------------------------------------------------- base: runtime, non-root
FROM ${PYTHON_IMAGE} AS base
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    FLEETFENCE_STATE_DIR=/var/lib/fleetfence/state \
    FLEETFENCE_HOST=0.0.0.0
RUN groupadd --system --gid 10001 fleetfence \
    && useradd --system --uid 10001 --gid fleetfence --home-dir /var/lib/fleetfence --shell /usr/sbin/nologin fleetfence \
    && mkdir -p /var/lib/fleetfence/state /var/lib/fleetfence/checkpoints /var/lib/fleetfence/spark-work /etc/fleetfence \
    && chown -R fleetfence:fleetfence /var/lib/fleetfence
COPY --from=build /opt/venv /opt/venv
# SPARK_HOME: the Spark distribution inside the pyspark wheel (jars/, bin/spark-class).
RUN ln -s /opt/venv/lib/python3.11/site-packages/pyspark /opt/spark
COPY deploy/healthcheck.py /usr/local/bin/fleetfence-healthcheck
RUN chmod 0755 /usr/local/bin/fleetfence-healthcheck
WORKDIR /var/lib/fleetfence
USER fleetfence

# ---------------------------------------------------------------- jvm: + Java 17 for Spark
FROM base AS jvm
USER root
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
    && rm -rf /var/lib/apt/lists/*
# Spark's Kafka connector, fetched at build time (the jars stage): the driver lists them in spark.jars.
COPY --from=jars /opt/fleetfence-jars /opt/fleetfence-jars
# Executors run Python workers with the driver's interpreter path: the same venv in every image.
ENV SPARK_HOME=/opt/spark \
    PYSPARK_PYTHON=/opt/venv/bin/python \
    PYSPARK_DRIVER_PYTHON=/opt/venv/bin/python \
    SPARK_NO_DAEMONIZE=1 \
    FLEETFENCE_JAR_CACHE=/opt/fleetfence-jars
USER fleetfence

# ---------------------------------------------------------------- service targets
FROM base AS gateway
EXPOSE 8883 5055 5027 9464
STOPSIGNAL SIGTERM
CMD ["fleetfence", "gateway"]

FROM base AS api
COPY --from=web /web/node_modules/leaflet /opt/fleetfence-web/node_modules/leaflet
COPY --from=web /web/node_modules/@geoman-io/leaflet-geoman-free /opt/fleetfence-web/node_modules/@geoman-io/leaflet-geoman-free
ENV FLEETFENCE_API_WEB_VENDOR_DIR=/opt/fleetfence-web/node_modules
EXPOSE 8000
CMD ["fleetfence", "api", "--host", "0.0.0.0"]

FROM base AS alerts
EXPOSE 9466
CMD ["fleetfence", "alerts", "run", "--config", "/etc/fleetfence/receivers.toml"]

FROM jvm AS processor
EXPOSE 9465
CMD ["fleetfence", "processor"]

FROM jvm AS spark
# The master's recovery directory (a volume in docker-compose.yml), owned by the non-root user.
USER root
RUN mkdir -p /var/lib/fleetfence/spark-recovery && chown fleetfence:fleetfence /var/lib/fleetfence/spark-recovery
USER fleetfence
EXPOSE 7077 8080 8081
# The master by default; the worker overrides the command (see docker-compose.yml). The work dir must
# be writable by the non-root user (the default, $SPARK_HOME/work, is not).
CMD ["/opt/spark/bin/spark-class", "org.apache.spark.deploy.master.Master", "--port", "7077", "--webui-port", "8080"]
