"""What every gateway replica shares, whichever way its vehicles' messages arrive: the I/O thread's
life cycle, the Prometheus endpoint and the service-registry announcement.

`gateway.service.Gateway` reads the vehicles' messages from Mosquitto; `gateway.edge.EdgeGateway` is
the MQTT server the vehicles connect to. Both run one I/O thread that owns the Kafka producer, and
both are stopped the same way: ask the thread to drain, wait for it, then take the endpoint and the
announcement down (in that order, so `fleetfence status` never shows a replica that answers no more).
"""

from __future__ import annotations

import threading

from fleetfence.metrics import MetricsServer, serve_metrics
from fleetfence.readmodels import ReadKeys
from fleetfence.registry import Announcer, new_record
from gateway.metrics import GatewayCollector, make_registry
from gateway.settings import GATEWAY_METRICS_PORT, GatewaySettings


class Replica:
    """The life cycle both kinds of gateway replica share; subclasses start `_thread` and say how
    to ask it to stop (`request_stop`) and whether it drained (`_drained`)."""

    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        self.client_id = settings.gateway_client_id_effective
        self._thread: threading.Thread | None = None
        self._drained = False
        self._metrics_server: MetricsServer | None = None
        self._announcer: Announcer | None = None
        self.metrics_port: int | None = None

    @property
    def running(self) -> bool:
        """The I/O thread is alive (started and not yet exited)."""
        return self._thread is not None and self._thread.is_alive()

    def request_stop(self) -> None:
        """Ask the I/O thread to drain and exit (safe from a signal handler)."""
        raise NotImplementedError

    def _expose(self, collector: GatewayCollector, device_url: str | None = None) -> None:
        """Serve /metrics and announce the replica in the service registry (`fleetfence status`
        finds it there; an edge also says where vehicles reach it). A failure stops the replica."""
        try:
            self._metrics_server = serve_metrics(
                "gateway",
                self.settings.host,
                self.settings.gateway_metrics_port,
                default_port=GATEWAY_METRICS_PORT,
                registry=make_registry(collector),
            )
        except BaseException:
            self.stop(drain_timeout_s=1.0)
            raise
        self.metrics_port = self._metrics_server.port if self._metrics_server else None
        self._announcer = Announcer(
            self.settings.redis_dsn,
            ReadKeys(self.settings.redis_prefix),
            new_record(
                "gateway",
                self.client_id,
                metrics_url=self._metrics_server.url if self._metrics_server else None,
                ttl_s=self.settings.registry_ttl_s,
                device_url=device_url,
            ),
        ).start()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until the I/O thread has exited; True when it drained everything it had taken."""
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                return False
        if self._announcer is not None:
            self._announcer.stop()
            self._announcer = None
        if self._metrics_server is not None:
            self._metrics_server.close()
            self._metrics_server = None
        return self._drained

    def stop(self, drain_timeout_s: float | None = None) -> bool:
        """Stop taking messages, wait for Kafka to confirm what is held, acknowledge it, close.

        Returns True when nothing was left unacknowledged: whatever was is sent again (by Mosquitto
        to the next session, or by the vehicle on its next connection), a duplicate, never a loss."""
        if drain_timeout_s is not None:
            self.settings = self.settings.model_copy(update={"gateway_drain_timeout_s": drain_timeout_s})
        self.request_stop()
        return self.wait(self.settings.gateway_drain_timeout_s + 10)
