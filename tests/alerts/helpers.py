"""Shared by the alert receivers' tests and their fixtures (conftest.py): a local webhook target."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import orjson

from alerts.webhook import verify_signature

SECRET = "test-webhook-secret"


@dataclass
class WebhookTarget:
    """A real HTTP server that counts 2xx-accepted deliveries and all attempts per alert_id."""

    respond: Callable[[str, int], int] = lambda _aid, _n: 200
    accepted: Counter[str] = field(default_factory=Counter)
    attempts: Counter[str] = field(default_factory=Counter)
    bad_signatures: int = 0
    idempotency_mismatch: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def start(self) -> WebhookTarget:
        target = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                aid = orjson.loads(body)["alert_id"]
                with target.lock:
                    if not verify_signature(SECRET.encode(), body, self.headers["X-FleetFence-Signature"]):
                        target.bad_signatures += 1
                    if self.headers["Idempotency-Key"] != aid:
                        target.idempotency_mismatch += 1
                    target.attempts[aid] += 1
                    status = target.respond(aid, target.attempts[aid])
                    if 200 <= status < 300:
                        target.accepted[aid] += 1
                body_out = b"" if status == 204 else b"ok"
                self.send_response(status)
                self.send_header("Content-Length", str(len(body_out)))
                self.end_headers()
                self.wfile.write(body_out)

            def log_message(self, *_a: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def accepted_ids(self) -> set[str]:
        with self.lock:
            return set(self.accepted)
