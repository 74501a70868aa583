"""MQTT fan-out: each alert to `fleet/{vehicle_id}/alerts` (retained) and `fleet/alerts`, QoS 1.

The per-vehicle topic is retained so a dashboard that subscribes later immediately gets each
vehicle's last alert; the fleet-wide topic is not retained (one retained message for the whole
fleet would be arbitrary). The receiver waits for both PUBACKs before the runner records the alert
as handled, so an alert is never marked done while it only sits in the client's buffer.
"""

from __future__ import annotations

import logging
import threading
import uuid

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.reasoncodes import ReasonCode

from alerts.config import MqttConfig
from alerts.errors import MqttPublishError
from alerts.model import Alert
from alerts.sink import Context, Outcome
from fleetfence.errors import ServiceUnavailableError
from fleetfence.mqtt import Account, login

logger = logging.getLogger(__name__)


class MqttFanoutSink:
    idempotent = False

    def __init__(
        self,
        cfg: MqttConfig,
        host: str,
        port: int,
        connect_timeout_s: float = 10.0,
        account: Account | None = None,
    ) -> None:
        self.cfg = cfg
        self._connected = threading.Event()
        self._refused_login: str | None = None
        # Message ids the broker refused (MQTT 5 reason code on the PUBACK), e.g. a topic outside
        # the account's rights: with MQTT 3.1.1 such a publish is acknowledged and dropped, so an
        # alert would be counted as delivered that nobody can ever receive.
        self._refused: dict[int, str] = {}
        self._client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"fleetfence-alerts-{cfg.name}-{uuid.uuid4().hex[:8]}",
            protocol=mqtt.MQTTv5,
        )
        login(self._client, account)  # the alerts account: publishes under the alert topics only
        self._client.on_connect = self._on_connect
        self._client.on_disconnect = self._on_disconnect
        self._client.on_publish = self._on_publish
        self._client.reconnect_delay_set(min_delay=1, max_delay=10)
        try:
            self._client.connect(host, port, keepalive=30)
        except OSError as exc:
            raise ServiceUnavailableError(f"MQTT broker {host}:{port} refused: {exc}") from exc
        self._client.loop_start()
        if not self._connected.wait(connect_timeout_s):
            self._client.loop_stop()
            why = f": {self._refused_login}" if self._refused_login else ""
            raise ServiceUnavailableError(f"MQTT broker {host}:{port} did not accept the connection{why}")

    def _on_connect(self, _c: mqtt.Client, _u: object, _f: object, rc: ReasonCode, _p: object = None) -> None:
        if rc.is_failure:
            self._refused_login = str(rc)
            logger.error("mqtt connect refused receiver=%s reason=%s", self.cfg.name, rc)
            return
        logger.info("mqtt connected receiver=%s rc=%s", self.cfg.name, rc)
        self._connected.set()

    def _on_publish(self, _c: mqtt.Client, _u: object, mid: int, rc: ReasonCode, _p: object) -> None:
        if rc.is_failure:
            self._refused[mid] = str(rc)

    def _on_disconnect(self, _c: mqtt.Client, _u: object, _f: object, rc: object, _p: object = None) -> None:
        logger.warning("mqtt disconnected receiver=%s rc=%s", self.cfg.name, rc)
        self._connected.clear()

    def topics(self, alert: Alert) -> list[tuple[str, bool]]:
        out = [(self.cfg.vehicle_topic.format(vehicle_id=alert.vehicle_id), self.cfg.retain_per_vehicle)]
        if self.cfg.all_topic:
            out.append((self.cfg.all_topic, False))
        return out

    def deliver(self, alert: Alert, ctx: Context) -> Outcome:
        infos = [
            self._client.publish(topic, alert.raw, qos=self.cfg.qos, retain=retain)
            for topic, retain in self.topics(alert)
        ]
        for info in infos:
            if info.rc not in (mqtt.MQTT_ERR_SUCCESS, mqtt.MQTT_ERR_NO_CONN):
                raise MqttPublishError(f"publish of {alert.alert_id} refused: {mqtt.error_string(info.rc)}")
        for info in infos:
            try:
                info.wait_for_publish(self.cfg.publish_timeout_s)
            except (RuntimeError, ValueError) as exc:
                raise MqttPublishError(f"publish of {alert.alert_id} failed: {exc}") from exc
            if not info.is_published():
                raise MqttPublishError(f"no PUBACK for {alert.alert_id} within {self.cfg.publish_timeout_s}s")
            refused = self._refused.pop(info.mid, None)
            if refused is not None:
                raise MqttPublishError(f"publish of {alert.alert_id} refused by the broker: {refused}")
        return Outcome.DELIVERED

    def close(self) -> None:
        self._client.disconnect()
        self._client.loop_stop()
