"""Phone trackers on the device edge: Traccar Client (the OsmAnd protocol) and OwnTracks' HTTP
mode, each fix answered only once Kafka has it.

Both apps send one fix per HTTP request and send it again until they get their answer, so the
answer is the acknowledgement: it is written when Kafka has confirmed the fix's record (acks=all),
as an MQTT PUBACK or a Teltonika record count is. A fix whose answer never came (the edge died, a
write outage outlasted the request) is still the phone's to resend; one stored twice is dropped
downstream by its `seq`, the fix's own time.

Routes, on `FLEETFENCE_GATEWAY_HTTP_PORT` (plain) and `FLEETFENCE_GATEWAY_HTTPS_PORT` (TLS, the
edge's own certificate):

- `POST /owntracks` (or `/pub`, the OwnTracks Recorder's path): an OwnTracks message, the app
  logged in with HTTP Basic as its vehicle (user: the vehicle id, password: the vehicle's device
  secret, the MQTT login's credentials). A location is answered `200 []`; any other message type
  carries no fix and is answered at once.
- any other path, `GET` or `POST`: an OsmAnd request (query, form or Traccar Client's JSON body)
  whose device id is bound to a vehicle (`PUT /api/v1/vehicles/{id}/trackers/osmand/{device id}`)
  and which carries that vehicle's device secret, so that knowing a device id is not enough to
  post for its vehicle: in the path (`/key/<secret>`: Traccar Client keeps the path of its server
  URL and appends its parameters) or as an HTTP Basic password. Answered `200`, empty body.

What is refused, and how: a login or a device id the vehicle master does not admit gets 401 or
403 and nothing is stored; a request whose fix is unusable but whose vehicle is known is
dead-lettered with its reason (header `tracker`) and answered 200, as the MQTT path acknowledges
a dead-lettered message: it is accounted for, and sending it again would not make it usable; a
request that names no device gets 400. When the fix cannot be stored now (the credential store
unreachable, the edge draining) the connection is closed without an answer, never answered with
an error status: OwnTracks takes *any* status as "posted" and would drop the fix.

One request at a time per connection (httptools, the C parser uvicorn uses, cuts the stream): a
pipelined request waits until the one before is answered. Everything runs on the edge's event
loop (`gateway.edge`); only the Redis reads of an identity run in worker threads, once per
connection and then every `gateway_edge_recheck_s`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import time
from collections import deque
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, cast
from urllib.parse import unquote_to_bytes, urlsplit

import httptools

from fleetfence.contracts import MAX_PAYLOAD_BYTES
from fleetfence.contracts import dead_letter as dead_letter_record
from fleetfence.devices import LoginVerdict, TrackerProtocol
from fleetfence.errors import ContractError
from fleetfence.settings import TopicNames
from gateway.core import Record
from gateway.errors import HttpRequestTooLargeError
from gateway.held import EdgeHost, HeldConnection
from gateway.inflight import Pending
from gateway.protocols import PhoneFix, osmand, owntracks

logger = logging.getLogger(__name__)

OWNTRACKS_PATHS = frozenset({"/owntracks", "/pub"})
KEY_SEGMENT = "key"  # an OsmAnd request's path `/key/<secret>`
MAX_BODY_BYTES = MAX_PAYLOAD_BYTES  # a larger body is refused (413) before it is read whole
MAX_HEADER_BYTES = 16 * 1024
MAX_QUEUED = 16  # requests pipelined ahead of the one being answered: a phone sends one at a time
REASONS = {200: b"OK", 400: b"Bad Request", 401: b"Unauthorized", 403: b"Forbidden"}
REASONS |= {405: b"Method Not Allowed", 413: b"Content Too Large", 500: b"Internal Server Error"}
SERVER = b"fleetfence-edge"
REALM = 'Basic realm="fleetfence", charset="UTF-8"'


class PhoneProtocol(StrEnum):
    """The HTTP trackers the edge speaks (the label their records and errors are counted under)."""

    OSMAND = TrackerProtocol.OSMAND.value
    OWNTRACKS = "owntracks"


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a request says it is: an OsmAnd device id (its binding names the vehicle) or an OwnTracks
    login (the vehicle id), with the vehicle's device secret it carries (None: none)."""

    protocol: PhoneProtocol
    name: str
    secret: bytes | None = None


@dataclass(frozen=True, slots=True)
class Admission:
    """An identity's verdict as the edge read it: `vehicle_id` set when admitted; `until_mono_s`
    when to read it again (a disabled, revoked or unbound sender is refused from then on)."""

    verdict: LoginVerdict
    vehicle_id: str | None
    until_mono_s: float


@dataclass(frozen=True, slots=True)
class Answer:
    """An HTTP answer before it is framed."""

    status: int
    body: bytes = b""
    content_type: bytes = b"text/plain; charset=utf-8"
    extra: tuple[tuple[bytes, bytes], ...] = ()


class PhoneHost(EdgeHost, Protocol):
    """What a phone's connection needs of the edge it runs in (`gateway.edge.EdgeGateway`)."""

    draining: bool

    @property
    def topics(self) -> TopicNames: ...

    def produce(self, e: Pending) -> None: ...

    def admit(self, conn: PhoneConnection, who: Identity) -> None: ...

    def phone_opened(self, conn: PhoneConnection) -> None: ...

    def phone_lost(self, conn: PhoneConnection) -> None: ...


def basic_login(authorization: str | None) -> tuple[str, bytes] | None:
    """(user, password) of an HTTP Basic `Authorization` header; None when absent or unreadable."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "basic" or not token:
        return None
    try:
        raw = base64.b64decode(token.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, sep, password = raw.partition(b":")
    if not sep:
        return None
    try:
        return user.decode("utf-8"), password
    except UnicodeDecodeError:
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    """One complete HTTP request as the connection read it; `keep_alive` says whether the client
    keeps the connection after the answer (HTTP/1.1 unless `Connection: close`)."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    keep_alive: bool = True


def protocol_of(req: Request) -> PhoneProtocol:
    owntracks_path = (req.path.rstrip("/") or "/") in OWNTRACKS_PATHS
    return PhoneProtocol.OWNTRACKS if owntracks_path else PhoneProtocol.OSMAND


def identify(req: Request) -> tuple[Identity | None, Answer | None]:
    """Who the request says it is, or the answer that refuses it before anything is read."""
    if protocol_of(req) is PhoneProtocol.OWNTRACKS:
        if req.method != "POST":
            return None, Answer(405, b"OwnTracks posts its messages\n", extra=((b"allow", b"POST"),))
        login = basic_login(req.headers.get("authorization"))
        if login is None:
            return None, Answer(
                401, b"log in as the vehicle\n", extra=((b"www-authenticate", REALM.encode()),)
            )
        return Identity(PhoneProtocol.OWNTRACKS, login[0], login[1]), None
    if req.method not in ("GET", "POST"):
        return None, Answer(405, b"OsmAnd sends GET or POST\n", extra=((b"allow", b"GET, POST"),))
    content_type = req.headers.get("content-type", "")
    device = osmand.device_id_of(query=req.query, body=req.body, content_type=content_type)
    if device is None:
        return None, Answer(400, b"the device id (id, deviceid or device_id) is required\n")
    return Identity(PhoneProtocol.OSMAND, device, osmand_secret(req)), None


def osmand_secret(req: Request) -> bytes | None:
    """The vehicle's device secret an OsmAnd request carries: the path's `/key/<secret>`, else an
    HTTP Basic password; None when it carries none."""
    head, _, rest = req.path.lstrip("/").partition("/")
    if head == KEY_SEGMENT and rest:
        return unquote_to_bytes(rest.rstrip("/"))
    login = basic_login(req.headers.get("authorization"))
    return None if login is None else login[1]


def refusal(who: Identity, verdict: LoginVerdict) -> Answer:
    """OsmAnd: 403 for a device no secret would admit (bound to nothing, its vehicle disabled), 401
    for a missing or wrong secret. OwnTracks: 401 for every refusal, as a login form says no more
    than "not this login" (which vehicle ids exist is nobody's business)."""
    osmand_device = who.protocol is PhoneProtocol.OSMAND
    if osmand_device and verdict in (LoginVerdict.UNKNOWN_DEVICE, LoginVerdict.NOT_ACTIVE):
        return Answer(403, f"{verdict.value}: bind the device to an active vehicle\n".encode())
    return Answer(401, f"{verdict.value}\n".encode(), extra=((b"www-authenticate", REALM.encode()),))


def decode(protocol: PhoneProtocol, req: Request, speed_unit: str) -> PhoneFix | owntracks.OwnTracksIgnored:
    """The request's fix (or an OwnTracks message without one); ContractError when unusable."""
    if protocol is PhoneProtocol.OWNTRACKS:
        return owntracks.decode_http(req.body)
    return osmand.parse_request(
        query=req.query,
        body=req.body,
        content_type=req.headers.get("content-type", ""),
        speed_unit=speed_unit,
    )


def record_of(
    topics: TopicNames, who: Identity, vehicle_id: str, req: Request, speed_unit: str, now_ms: int
) -> Record | None:
    """The Kafka record a request becomes: telemetry, a dead letter with its reason, or None for an
    OwnTracks message that carries no fix."""
    try:
        fix = decode(who.protocol, req, speed_unit)
        if isinstance(fix, owntracks.OwnTracksIgnored):
            return None
        if isinstance(fix, osmand.OsmAndFix):
            telemetry = osmand.to_telemetry(fix, vehicle_id=vehicle_id, received_ms=now_ms)
        else:
            assert isinstance(fix, owntracks.OwnTracksFix)
            telemetry = owntracks.to_telemetry(fix, vehicle_id=vehicle_id, received_ms=now_ms)
    except ContractError as exc:
        payload = req.body if req.body else req.query.encode()
        value, headers = dead_letter_record(
            payload[:MAX_PAYLOAD_BYTES],
            reason=str(exc.reason),
            detail=str(getattr(exc, "detail", exc)),
            origin=("tracker", f"{who.protocol.value}:{who.name}".encode()),
            received_ms=now_ms,
        )
        return Record(topics.telemetry_dlq, vehicle_id.encode(), value, headers, str(exc.reason))
    return Record(topics.telemetry, vehicle_id.encode(), telemetry.to_json(), None, None)


class PhoneConnection(HeldConnection):
    """One phone's HTTP/1.1 connection: a request read, its sender admitted, its fix held for
    Kafka, its answer written when Kafka has it; then the next request.

    httptools (llhttp, the C parser uvicorn uses) cuts the byte stream into requests through its
    callbacks; what they collect lands in `_queued` on each complete message, and the connection
    takes the queue's head only once the request before it is answered."""

    def __init__(self, edge: PhoneHost, speed_unit: str = "kn") -> None:
        super().__init__(edge)
        self.edge = edge
        self.speed_unit = speed_unit
        self.parser = httptools.HttpRequestParser(self)
        self.admitted: dict[Identity, Admission] = {}
        self._url = bytearray()
        self._headers: dict[str, str] = {}
        self._header_bytes = 0
        self._body = bytearray()
        self._queued: deque[Request] = deque()  # complete, not yet taken
        self._busy: Request | None = None  # taken, not yet answered
        self._waiting_for: Identity | None = None
        self._eof = False
        self._broken: tuple[str, str, int] | None = None  # (reason, detail, status) of a bad request

    # ------------------------------------------------------------------ asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.edge.phone_opened(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.edge.phone_lost(self)

    def data_received(self, data: bytes) -> None:
        self.last_rx_mono_s = time.monotonic()
        if self._broken is not None:
            return  # nothing after a broken request is read
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._broken = ("bad_http", "protocol upgrades are not served", 400)
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            too_large = isinstance(cause, HttpRequestTooLargeError)
            self._broken = (
                "too_large" if too_large else "bad_http",
                str(cause or exc),
                413 if too_large else 400,
            )
        except HttpRequestTooLargeError as exc:
            self._broken = ("too_large", str(exc), 413)
        except httptools.HttpParserError as exc:
            self._broken = ("bad_http", str(exc), 400)
        # The requests complete before a broken one are taken and answered first.
        self._next()

    def eof_received(self) -> bool | None:
        """The phone will send nothing more: what it sent is answered, then the connection closes
        (half-open meanwhile; TLS cannot be, and an answer owed then is lost with the connection:
        the phone sends that fix again)."""
        self._eof = True
        if self._busy is None and not self._queued:
            self.close()
        tls = self.transport is not None and self.transport.get_extra_info("ssl_object") is not None
        return not tls

    # ------------------------------------------------------------------ httptools' callbacks

    def on_message_begin(self) -> None:
        self._url.clear()
        self._headers = {}
        self._header_bytes = 0
        self._body.clear()

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._header_bytes += len(url)
        if self._header_bytes > MAX_HEADER_BYTES:
            raise HttpRequestTooLargeError(f"request head over {MAX_HEADER_BYTES} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value)
        if self._header_bytes > MAX_HEADER_BYTES:
            raise HttpRequestTooLargeError(f"request head over {MAX_HEADER_BYTES} bytes")
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        length = self._headers.get("content-length", "")
        if length.isdigit() and int(length) > MAX_BODY_BYTES:
            raise HttpRequestTooLargeError(f"body of {int(length)} bytes")

    def on_body(self, body: bytes) -> None:
        self._body += body
        if len(self._body) > MAX_BODY_BYTES:
            raise HttpRequestTooLargeError(f"body over {MAX_BODY_BYTES} bytes")

    def on_message_complete(self) -> None:
        if len(self._queued) >= MAX_QUEUED:
            raise HttpRequestTooLargeError(f"more than {MAX_QUEUED} requests pipelined")
        target = urlsplit(self._url.decode("latin-1"))
        self._queued.append(
            Request(
                method=self.parser.get_method().decode("latin-1"),
                path=target.path or "/",
                query=target.query,
                headers=self._headers,
                body=bytes(self._body),
                keep_alive=self.parser.should_keep_alive(),
            )
        )

    # ------------------------------------------------------------------ requests

    @property
    def busy(self) -> bool:
        return self._busy is not None

    def _next(self) -> None:
        """Take the next complete request, if the one before is answered."""
        if self.closed or self._busy is not None:
            return
        if self._queued:
            self._on_request(self._queued.popleft())
        elif self._broken is not None:
            self._protocol_error(*self._broken)
        elif self._eof:
            self.close()

    def _on_request(self, req: Request) -> None:
        """Take `req`; a failure of the edge's own code costs this connection only (500, closed)."""
        try:
            self._take(req)
        except Exception:
            logger.exception("phone request failed peer=%s", self.peer)
            self.edge.stats.protocol_errors["http:internal"] += 1
            if not self.inflight:
                self.write(self._frame(Answer(500, b"internal error\n"), False))
            self.close()

    def _take(self, req: Request) -> None:
        self._busy = req
        who, answer = identify(req)
        if answer is not None or who is None:
            protocol = protocol_of(req)
            if answer is not None and answer.status == 401:
                verdict = LoginVerdict.NO_CREDENTIALS_GIVEN
                self.edge.stats.logins_refused[f"{protocol.value}:{verdict.value}"] += 1
            self._count(protocol.value, "refused")
            self._answer(answer or Answer(400))
            return
        if self.edge.draining:
            self.edge.stats.deferred += 1
            self.close()  # unanswered: the phone sends it again to a replica that takes it
            return
        known = self.admitted.get(who)
        if known is not None and known.until_mono_s > time.monotonic():
            self._go_on(who, known)
            return
        self._waiting_for = who
        self.edge.admit(self, who)

    def admission(
        self, who: Identity, verdict: LoginVerdict, vehicle_id: str | None, recheck_s: float
    ) -> None:
        """The identity was read (`PhoneHost.admit`): refuse the request, or take its fix."""
        if self.closed or self._waiting_for != who:
            return
        self._waiting_for = None
        known = Admission(verdict, vehicle_id, time.monotonic() + recheck_s)
        if verdict is LoginVerdict.ACCEPTED:
            self.admitted[who] = known
        else:
            self.admitted.pop(who, None)
        self._go_on(who, known)

    def unavailable(self, who: Identity) -> None:
        """The identity could not be read (Redis down): no answer; the phone sends it again."""
        if self.closed or self._waiting_for != who:
            return
        self.edge.stats.logins_refused[f"{who.protocol.value}:unavailable"] += 1
        self.close()

    def _go_on(self, who: Identity, known: Admission) -> None:
        req = self._busy
        assert req is not None
        if known.verdict is not LoginVerdict.ACCEPTED or known.vehicle_id is None:
            self.edge.stats.logins_refused[f"{who.protocol.value}:{known.verdict.value}"] += 1
            logger.info(
                "tracker refused protocol=%s id=%r peer=%s reason=%s",
                who.protocol,
                who.name,
                self.peer,
                known.verdict,
            )
            self._count(who.protocol.value, "refused")
            self._answer(refusal(who, known.verdict))
            return
        now_ms = time.time_ns() // 1_000_000
        record = record_of(self.edge.topics, who, known.vehicle_id, req, self.speed_unit, now_ms)
        owntracks_ok = Answer(200, b"[]", b"application/json")
        ok = owntracks_ok if who.protocol is PhoneProtocol.OWNTRACKS else Answer(200)
        if record is None:
            self._count(who.protocol.value, "ignored")
            self._answer(ok)
            return
        self.edge.stats.received += 1
        self._count(who.protocol.value, "received")
        e = self.inflight.add(0, 0, record, time.monotonic())
        e.owner = self
        e.protocol = who.protocol.value
        e.reply = self._frame(ok, req.keep_alive)  # written when Kafka has it (HeldConnection.stored)
        self.edge.produce(e)

    # ------------------------------------------------------------------ answers

    def stored(self, e: Pending) -> None:
        super().stored(e)
        if not self.inflight and not self.closed and self._busy is not None:
            self.flush()
            # The next request is taken outside Kafka's delivery callback, which this runs in.
            asyncio.get_running_loop().call_soon(self._done, self._busy.keep_alive)

    def _count(self, protocol: str, outcome: str) -> None:
        self.edge.stats.tracker_records[(protocol, outcome)] += 1

    def _frame(self, answer: Answer, keep_alive: bool) -> bytes:
        head = [
            b"HTTP/1.1 %d %s\r\n" % (answer.status, REASONS.get(answer.status, b"Unknown")),
            b"content-type: %s\r\ncontent-length: %d\r\nserver: %s\r\n"
            % (answer.content_type, len(answer.body), SERVER),
            *(b"%s: %s\r\n" % kv for kv in answer.extra),
            b"" if keep_alive else b"connection: close\r\n",
            b"\r\n",
        ]
        return b"".join(head) + answer.body

    def _answer(self, answer: Answer) -> None:
        """Answer now (nothing of the request is stored): a refusal, or a message without a fix."""
        req = self._busy
        keep_alive = req is not None and req.keep_alive
        self.write(self._frame(answer, keep_alive))
        self._done(keep_alive)

    def _done(self, keep_alive: bool) -> None:
        """The request is answered: the next one, or the close it asked for."""
        self._busy = None
        if not keep_alive:
            self.close()
            return
        self._next()

    def _protocol_error(self, reason: str, detail: str, status: int) -> None:
        """A stream that is not HTTP this edge takes: answered (unless an answer is owed before
        it, which is then lost with the connection: the phone sends that fix again) and closed."""
        self.edge.stats.protocol_errors[f"http:{reason}"] += 1
        # The parser's words only: what the client sent (a header with a secret) is neither logged
        # nor echoed.
        logger.info("http request refused peer=%s reason=%s detail=%s", self.peer, reason, detail[:120])
        if self._busy is None and not self.inflight:
            self.write(self._frame(Answer(status, f"{reason}\n".encode()), False))
        self.close()
