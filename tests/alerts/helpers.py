"""Shared by the alert receivers' tests and their fixtures (conftest.py): a local webhook target and
a local SMTP server."""

from __future__ import annotations

import ssl
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from email import policy
from email.message import EmailMessage
from email.parser import BytesParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal

import orjson
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session

from alerts.webhook import verify_signature
from fleetfence.probes import free_port

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


SMTP_USER = "fleet-mailer"
SMTP_PASSWORD = "test-smtp-password"


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    cert: Path
    key: Path


@dataclass(frozen=True)
class Received:
    """One message the server accepted (250 after DATA), as the server saw it."""

    mail_from: str
    rcpt_tos: list[str]
    message: EmailMessage
    tls: bool
    login: str | None


@dataclass
class SmtpServer:
    """A real SMTP server (aiosmtpd) on a free port: STARTTLS or implicit TLS, AUTH PLAIN/LOGIN
    required, and `respond(n)` choosing the reply to the n-th DATA (default 250)."""

    tls_files: TlsFiles
    mode: Literal["starttls", "implicit"] = "starttls"
    respond: Callable[[int], str] = lambda _n: "250 OK"
    received: list[Received] = field(default_factory=list)
    data_attempts: int = 0
    auth_failures: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    controller: Controller | None = None

    @property
    def port(self) -> int:
        assert self.controller is not None
        return int(self.controller.port)

    def start(self) -> SmtpServer:
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(self.tls_files.cert, self.tls_files.key)
        server = self

        class Handler:
            async def handle_DATA(self, smtp: SMTP, session: Session, envelope: Envelope) -> str:  # noqa: N802
                with server.lock:
                    server.data_attempts += 1
                    reply = server.respond(server.data_attempts)
                    if reply.startswith("250"):
                        assert isinstance(envelope.content, bytes)
                        wire = envelope.content.replace(b"\r\n", b"\n")  # SMTP's CRLF, as a client stores it
                        msg = BytesParser(policy=policy.default).parsebytes(wire)
                        assert isinstance(msg, EmailMessage)
                        transport: Any = smtp.transport
                        server.received.append(
                            Received(
                                str(envelope.mail_from),
                                list(envelope.rcpt_tos),
                                msg,
                                transport is not None and transport.get_extra_info("ssl_object") is not None,
                                None if session.auth_data is None else str(session.auth_data),
                            )
                        )
                return reply

        def authenticate(
            _smtp: SMTP, _session: Session, _envelope: Envelope, _mechanism: str, data: Any
        ) -> AuthResult:
            ok = (
                isinstance(data, LoginPassword)
                and data.login.decode() == SMTP_USER
                and data.password.decode() == SMTP_PASSWORD
            )
            if not ok:
                with server.lock:
                    server.auth_failures += 1
            return AuthResult(success=ok, handled=False, auth_data=SMTP_USER if ok else None)

        kwargs: dict[str, Any] = {"auth_required": True, "authenticator": authenticate}
        if self.mode == "starttls":
            kwargs.update(tls_context=tls, require_starttls=True)
        else:
            # The listener itself is TLS; aiosmtpd only tracks STARTTLS, so it is told not to ask.
            kwargs.update(ssl_context=tls, auth_require_tls=False)
        self.controller = Controller(
            Handler(), hostname="127.0.0.1", port=free_port(), server_hostname="localhost", **kwargs
        )
        self.controller.start()
        return self

    def stop(self) -> None:
        if self.controller is not None:
            self.controller.stop()

    def snapshot(self) -> list[Received]:
        with self.lock:
            return list(self.received)
