"""Prometheus endpoints of the services: bind one (`serve_metrics`, the one way every service does)
and read one back (`scrape`, for `fleetfence status`).

Each service has a well-known default port (gateway 9464, processor 9465, receivers 9466, archive
9467); 0 turns the endpoint off. Several replicas on one host (and tests running several
processes) would collide on a default port, so when the *default* port is busy the endpoint takes
an ephemeral port instead and says so in the log; the service registry (`fleetfence.registry`)
announces the real URL, so `fleetfence status` still finds it. A port someone configured on
purpose that is busy is a `PortInUseError`: silently serving elsewhere would hide a
misconfiguration from the scraper configured for that port.
"""

from __future__ import annotations

import errno
import logging
import socket
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client import REGISTRY, start_http_server
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from fleetfence.errors import PortInUseError

logger = logging.getLogger(__name__)

WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})


def advertised_host(bind_host: str) -> str:
    """The host name others reach a server bound to `bind_host` by: the machine's name when it
    listens on every interface, else the bind address itself."""
    return socket.gethostname() if bind_host in WILDCARD_HOSTS else bind_host


def http_url(bind_host: str, port: int, path: str) -> str:
    host = advertised_host(bind_host)
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    return f"http://{host}:{port}{path}"


@dataclass
class MetricsServer:
    """A running Prometheus endpoint; `close()` stops it (the port is free again)."""

    host: str
    port: int
    server: Any

    @property
    def url(self) -> str:
        return http_url(self.host, self.port, "/metrics")

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


def serve_metrics(
    what: str,
    host: str,
    port: int,
    *,
    default_port: int,
    registry: CollectorRegistry = REGISTRY,
) -> MetricsServer | None:
    """Serve `registry` on `host:port` for the service `what`; None when `port` is 0 (off).

    When `port` is the service's default and busy, an ephemeral port is taken instead (logged);
    any other busy port raises PortInUseError."""
    if port == 0:
        return None
    try:
        server, _thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        if port != default_port:
            raise PortInUseError(
                f"{what} metrics port {host}:{port} is in use by another process; choose a free "
                "one, or 0 to turn the endpoint off"
            ) from exc
        server, _thread = start_http_server(0, addr=host, registry=registry)
        logger.warning(
            "default metrics port busy, serving on an ephemeral port instead service=%s "
            "default_port=%s port=%s",
            what,
            port,
            server.server_port,
        )
    ms = MetricsServer(host, int(server.server_port), server)
    logger.info("metrics endpoint service=%s url=%s", what, ms.url)
    return ms


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


@dataclass(frozen=True)
class Scrape:
    """The samples of one Prometheus exposition."""

    samples: tuple[Sample, ...]

    def _matching(self, name: str) -> Iterable[Sample]:
        return (s for s in self.samples if s.name == name)

    def total(self, name: str) -> float:
        """The sum of every sample called `name` (over all its label sets); 0 when none."""
        return sum(s.value for s in self._matching(name))

    def by_label(self, name: str, label: str) -> dict[str, float]:
        """The samples called `name`, summed per value of `label`."""
        out: dict[str, float] = {}
        for s in self._matching(name):
            key = s.labels.get(label, "")
            out[key] = out.get(key, 0.0) + s.value
        return out


def parse_exposition(text: str) -> Scrape:
    return Scrape(
        tuple(
            Sample(s.name, dict(s.labels), float(s.value))
            for fam in text_string_to_metric_families(text)
            for s in fam.samples
        )
    )


def http_get(url: str, timeout_s: float) -> tuple[int, str]:
    """GET `url`: (status, body). Raises OSError when it does not answer."""
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        return int(resp.status), resp.read().decode(errors="replace")


def scrape(url: str, timeout_s: float = 2.0) -> Scrape:
    """Read a Prometheus endpoint. Raises OSError when it does not answer, ValueError on a body
    that is not the text exposition format."""
    _status, body = http_get(url, timeout_s)
    return parse_exposition(body)
