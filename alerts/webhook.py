"""Webhook receiver: POST each alert's JSON, signed, retried with bounded back-off, dead-lettered.

Headers on every request:

- `X-FleetFence-Signature: sha256=<hex>`: HMAC-SHA256 of the exact body bytes with the secret,
  so the target can verify origin and integrity (`verify_signature` shows how);
- `Idempotency-Key` and `X-FleetFence-Alert-Id`: the alert_id. The receiver records an alert only
  after the target answered 2xx; if its process dies after the target accepted the POST but before
  that record, the alert is POSTed again after the restart, with the same key. "Once" for a webhook
  therefore means: at most one 2xx-accepted delivery per alert_id while the receiver lives, and
  across a crash at that one instant a repeat the target can recognise by the key.
- `X-FleetFence-Attempt`: 1 for the first attempt, counting up on retries.

Status handling: 2xx delivered; 408, 425, 429, 5xx and network errors are retried with exponential
back-off plus jitter (capped), up to `max_attempts` in total; any other status is a permanent
rejection. Both exhausted retries and rejections go to `fleet.alerts.dlq` with the reason.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import logging
import random
from urllib.parse import urlsplit

from alerts.config import WebhookConfig
from alerts.model import Alert
from alerts.sink import Context, Outcome
from fleetfence import __version__
from fleetfence.errors import ConfigError

logger = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-FleetFence-Signature"
IDEMPOTENCY_HEADER = "Idempotency-Key"
ALERT_ID_HEADER = "X-FleetFence-Alert-Id"
ATTEMPT_HEADER = "X-FleetFence-Attempt"
RETRYABLE_STATUS = frozenset({408, 425, 429})


def sign(secret: bytes, body: bytes) -> str:
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def verify_signature(secret: bytes, body: bytes, header: str | None) -> bool:
    """What a webhook target does: recompute and compare in constant time."""
    return header is not None and hmac.compare_digest(sign(secret, body), header)


def backoff_ms(attempt: int, initial_ms: int, max_ms: int, rng: random.Random | None = None) -> float:
    """Delay before retry number `attempt` (1-based): initial·2^(attempt-1), capped, with ±20 %
    jitter so many receivers failing together do not retry in lock-step."""
    base = min(max_ms, initial_ms * 2 ** (attempt - 1))
    jitter = (rng or random).uniform(0.8, 1.2)
    return float(min(max_ms, base * jitter))


class WebhookSink:
    idempotent = False

    def __init__(self, cfg: WebhookConfig) -> None:
        self.cfg = cfg
        self._secret = cfg.resolve_secret()
        parts = urlsplit(cfg.url)
        if parts.hostname is None:
            raise ConfigError(f"receiver {cfg.name!r}: url {cfg.url!r} has no host")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        self._path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._conn: http.client.HTTPConnection | None = None

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            self._conn = cls(self._host, self._port, timeout=self.cfg.timeout_s)
        return self._conn

    def _drop_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def post(self, body: bytes, alert_id: str, attempt: int) -> tuple[int | None, str]:
        """One attempt: (status, short description); status None for a network failure."""
        headers = {
            "Content-Type": "application/json",
            "User-Agent": f"fleetfence-alerts/{__version__}",
            SIGNATURE_HEADER: sign(self._secret, body),
            IDEMPOTENCY_HEADER: alert_id,
            ALERT_ID_HEADER: alert_id,
            ATTEMPT_HEADER: str(attempt),
            **self.cfg.headers,
        }
        try:
            conn = self._connection()
            conn.request("POST", self._path, body=body, headers=headers)
            resp = conn.getresponse()
            text = resp.read(512).decode("utf-8", "replace")
            resp.read()  # drain so the connection can be reused
            if resp.getheader("Connection", "").lower() == "close":
                self._drop_connection()
            return resp.status, f"HTTP {resp.status} {text[:200]}".strip()
        except (OSError, http.client.HTTPException) as exc:
            self._drop_connection()
            return None, f"{type(exc).__name__}: {exc}"[:300]

    def deliver(self, alert: Alert, ctx: Context) -> Outcome:
        last = ""
        status: int | None = None
        for attempt in range(1, self.cfg.max_attempts + 1):
            if attempt > 1:
                ctx.metrics.retried()
                ctx.sleep(
                    backoff_ms(attempt - 1, self.cfg.backoff_initial_ms, self.cfg.backoff_max_ms) / 1000
                )
            status, last = self.post(alert.raw, alert.alert_id, attempt)
            if status is not None and 200 <= status < 300:
                return Outcome.DELIVERED
            retryable = status is None or status >= 500 or status in RETRYABLE_STATUS
            logger.warning(
                "webhook attempt failed receiver=%s alert_id=%s attempt=%s retryable=%s detail=%s",
                self.cfg.name,
                alert.alert_id,
                attempt,
                retryable,
                last,
            )
            if not retryable:
                return self._dead_letter(alert, ctx, "rejected", detail=last, attempts=attempt, status=status)
        return self._dead_letter(
            alert, ctx, "retries_exhausted", detail=last, attempts=self.cfg.max_attempts, status=status
        )

    def _dead_letter(
        self, alert: Alert, ctx: Context, reason: str, *, detail: str, attempts: int, status: int | None
    ) -> Outcome:
        if ctx.dead_letters is None:
            raise ConfigError(f"receiver {self.cfg.name!r} has no dead-letter topic")
        ctx.dead_letters.send(
            ctx.source,
            alert.raw,
            reason,
            detail,
            alert_id=alert.alert_id,
            attempts=attempts,
            http_status=status if status is not None else "none",
        )
        logger.error(
            "webhook dead-lettered receiver=%s alert_id=%s reason=%s attempts=%s",
            self.cfg.name,
            alert.alert_id,
            reason,
            attempts,
        )
        return Outcome.DEAD_LETTERED

    def close(self) -> None:
        self._drop_connection()
