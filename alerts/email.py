"""E-mail receiver: alerts by SMTP (smtplib), batched so that a storm sends one mail, not hundreds.

Batching: the first alert the receiver holds opens a window of `interval_s`; when it closes, each
recipient gets one mail listing every alert of the window (the subject says how many), over one
SMTP connection, one transaction per recipient. The next alert opens the next window, so a
recipient gets at most one mail per `interval_s`. A single alert's mail uses its type's templates.

Exactly once, with the runner (alerts/runner.py): the sink answers `HELD` for an alert it keeps,
and the runner commits no offset at or past a held alert. After the server accepted a recipient's
mail (250 after DATA) the sink records `mail:{recipient}:{alert_id}` for each alert of that mail in
the receiver's de-duplication store; only when every recipient has an alert does the runner record
the alert itself and let its offset be committed. So:

- a crash or a stop while alerts are held loses nothing: their offsets were not committed, the
  next run reads them again and mails them;
- after a restart nothing already accepted is mailed again: a re-read alert is held only for the
  recipients without a record;
- a crash in the one instant between the server's acceptance and that record repeats that mail.
  No sender can close this window alone, so every mail carries a `Message-ID` derived from its
  recipient and its alert ids (the same alerts to the same recipient: the same Message-ID) and
  `X-FleetFence-Alert-Ids`, as the webhook's `Idempotency-Key`.

Errors: a 4xx reply, a network error or a timeout is retried with exponential back-off plus
jitter, up to `max_attempts` in total, then the mail's alerts go to `fleet.alerts.dlq` with
`reason=retries_exhausted`; a 5xx reply (a refused recipient, a failed login: 535) is permanent
and goes there at once with `reason=rejected`. Each dead letter names the recipient and the SMTP
code; the alert is then recorded as handled for that recipient.
"""

from __future__ import annotations

import hashlib
import logging
import smtplib
import socket
import ssl
import string
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from email.message import EmailMessage
from email.utils import formatdate, parseaddr
from typing import Any, Literal

from alerts.config import DEFAULT_BATCH_SUBJECT, DEFAULT_BODY, DEFAULT_SUBJECT, EmailConfig
from alerts.dedup import Dedup
from alerts.model import Alert
from alerts.sink import Context, Outcome, Settled
from alerts.webhook import backoff_ms
from fleetfence.contracts import ms_to_iso
from fleetfence.errors import ConfigError

logger = logging.getLogger(__name__)

RECEIVER_HEADER = "X-FleetFence-Receiver"
COUNT_HEADER = "X-FleetFence-Alert-Count"
IDS_HEADER = "X-FleetFence-Alert-Ids"
#: Above this many alerts a mail lists their ids in its body only (headers have size limits).
MAX_IDS_IN_HEADER = 200
SEPARATOR = "\n" + "-" * 60 + "\n"

Verdict = Literal["sent", "transient", "permanent"]


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.5f}"


def _detail(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def alert_fields(a: Alert) -> dict[str, str]:
    """What an alert's templates may use (`alerts.config.ALERT_FIELDS`), every value a string."""
    return {
        "type": a.type.value,
        "vehicle_id": a.vehicle_id,
        "zone_id": a.zone_id or "-",
        "route_id": a.route_id or "-",
        "place": a.zone_id or a.route_id or "-",
        "time": ms_to_iso(a.ts_ms),
        "seq": str(a.seq),
        "alert_id": a.alert_id,
        "lat": _num(a.lat),
        "lon": _num(a.lon),
        "details": " ".join(f"{k}={_detail(v)}" for k, v in sorted(a.details.items())) or "-",
    }


def batch_fields(alerts: Sequence[Alert]) -> dict[str, str]:
    """What the batch subject may use (`alerts.config.BATCH_FIELDS`)."""
    types = Counter(a.type.value for a in alerts)
    vehicles = sorted({a.vehicle_id for a in alerts})
    shown = ", ".join(vehicles[:5]) + (f" and {len(vehicles) - 5} more" if len(vehicles) > 5 else "")
    times = [a.ts_ms for a in alerts]
    return {
        "count": str(len(alerts)),
        "types": ", ".join(f"{n} {t}" for t, n in sorted(types.items(), key=lambda x: (-x[1], x[0]))),
        "vehicles": shown,
        "first_time": ms_to_iso(min(times)),
        "last_time": ms_to_iso(max(times)),
    }


def message_id(receiver: str, recipient: str, alert_ids: Iterable[str], domain: str) -> str:
    """The same alerts to the same recipient give the same Message-ID: a repeat after a crash at the
    instant of acceptance is recognisable (mail clients and archives collapse equal ids)."""
    h = hashlib.sha256("\0".join([receiver, recipient.lower(), *sorted(alert_ids)]).encode())
    return f"<ff.{h.hexdigest()[:32]}@{domain}>"  # short enough never to be folded


def recipient_marker(recipient: str, alert_id: str) -> str:
    """The de-duplication id recording that `recipient` has the alert (mailed or dead-lettered)."""
    return f"mail:{recipient.lower()}:{alert_id}"


@dataclass
class _Held:
    alert: Alert
    ctx: Context
    pending: set[str]
    dead_lettered: bool = False


@dataclass
class Attempt:
    """How one SMTP attempt ended: sent, or failed and whether a retry can help."""

    verdict: Verdict
    detail: str
    code: int | None = None


@dataclass
class _Mail:
    recipient: str
    held: list[_Held]
    message: EmailMessage = field(repr=False)


class EmailSink:
    """A `HoldingSink` (alerts/sink.py): holds alerts, mails them per window, settles them."""

    idempotent = False

    def __init__(self, cfg: EmailConfig, dedup: Dedup) -> None:
        self.cfg = cfg
        self._dedup = dedup
        self._password = cfg.resolve_password()
        self._envelope_from = parseaddr(cfg.sender)[1]
        self._domain = self._envelope_from.rpartition("@")[2]
        self._tls: ssl.SSLContext | None = None
        if cfg.tls != "none":
            try:
                self._tls = ssl.create_default_context(cafile=str(cfg.ca_file) if cfg.ca_file else None)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(f"receiver {cfg.name!r}: ca_file {cfg.ca_file}: {exc}") from exc
        self._held: dict[str, _Held] = {}
        self._due: float | None = None
        self._unmarked: list[str] = []
        self._smtp: smtplib.SMTP | None = None

    # ------------------------------------------------------------------ the HoldingSink contract

    def deliver(self, alert: Alert, ctx: Context) -> Outcome:
        if alert.alert_id in self._held:
            return Outcome.DUPLICATE
        recipients = self.cfg.recipients
        had = self._dedup.seen_many([recipient_marker(r, alert.alert_id) for r in recipients])
        pending = {r for r, seen in zip(recipients, had, strict=True) if not seen}
        if not pending:  # every recipient has it: mailed before a crash that preceded the record
            return Outcome.DUPLICATE
        self._held[alert.alert_id] = _Held(alert, ctx, pending)
        if self._due is None:
            self._due = time.monotonic() + self.cfg.interval_s
        return Outcome.HELD

    def held_count(self) -> int:
        return len(self._held)

    def held_from(self) -> Mapping[tuple[str, int], int]:
        out: dict[tuple[str, int], int] = {}
        for h in self._held.values():
            key = (h.ctx.source.topic, h.ctx.source.partition)
            out[key] = min(out.get(key, h.ctx.source.offset), h.ctx.source.offset)
        return out

    def release(self, partitions: Iterable[tuple[str, int]]) -> int:
        gone = set(partitions)
        dropped = [a for a, h in self._held.items() if (h.ctx.source.topic, h.ctx.source.partition) in gone]
        for aid in dropped:
            del self._held[aid]
        if not self._held:
            self._due = None
        return len(dropped)

    def settle(self, now: float) -> list[Settled]:
        self._write_marks()  # what an earlier call could not record (Redis was down)
        if not self._held or self._due is None or now < self._due:
            return []
        try:
            for r in self.cfg.recipients:
                batch = [h for h in self._held.values() if r in h.pending]
                if batch:
                    self._mail(r, batch)
        finally:
            self._disconnect()
        done = [h for h in self._held.values() if not h.pending]
        for h in done:
            del self._held[h.alert.alert_id]
        if not self._held:
            self._due = None
        return [
            Settled(h.alert, Outcome.DEAD_LETTERED if h.dead_lettered else Outcome.DELIVERED) for h in done
        ]

    def close(self) -> None:
        self._disconnect()

    # ------------------------------------------------------------------ one recipient's mail

    def _mail(self, recipient: str, batch: list[_Held]) -> None:
        """Send (or dead-letter) one recipient's mail, then record it before the next recipient."""
        ctx = batch[0].ctx
        mail = _Mail(recipient, batch, self.compose(recipient, [h.alert for h in batch]))
        last = Attempt("transient", "")
        for attempt in range(1, self.cfg.max_attempts + 1):
            if attempt > 1:
                ctx.metrics.retried()
                ctx.sleep(
                    backoff_ms(attempt - 1, self.cfg.backoff_initial_ms, self.cfg.backoff_max_ms) / 1000
                )
            last = self.send_once(recipient, mail.message)
            if last.verdict == "sent":
                ctx.metrics.message_sent()
                logger.info(
                    "email sent receiver=%s recipient=%s alerts=%s attempt=%s message_id=%s",
                    self.cfg.name,
                    recipient,
                    len(batch),
                    attempt,
                    mail.message["Message-ID"],
                )
                break
            logger.warning(
                "email attempt failed receiver=%s recipient=%s alerts=%s attempt=%s retryable=%s detail=%s",
                self.cfg.name,
                recipient,
                len(batch),
                attempt,
                last.verdict == "transient",
                last.detail,
            )
            if last.verdict == "permanent":
                self._dead_letter(mail, "rejected", last, attempt)
                break
        else:
            self._dead_letter(mail, "retries_exhausted", last, self.cfg.max_attempts)
        # In memory first: should Redis fail now, the retry records these without mailing again.
        for h in batch:
            h.pending.discard(recipient)
        self._unmarked.extend(recipient_marker(recipient, h.alert.alert_id) for h in batch)
        self._write_marks()

    def _write_marks(self) -> None:
        if self._unmarked:
            self._dedup.mark_many(self._unmarked)
            self._unmarked = []

    def _dead_letter(self, mail: _Mail, reason: str, last: Attempt, attempts: int) -> None:
        for h in mail.held:
            if h.ctx.dead_letters is None:
                raise ConfigError(f"receiver {self.cfg.name!r} has no dead-letter topic")
            h.ctx.dead_letters.send(
                h.ctx.source,
                h.alert.raw,
                reason,
                last.detail,
                alert_id=h.alert.alert_id,
                attempts=attempts,
                recipient=mail.recipient,
                smtp_code=last.code if last.code is not None else "none",
            )
            h.dead_lettered = True
        logger.error(
            "email dead-lettered receiver=%s recipient=%s alerts=%s reason=%s attempts=%s detail=%s",
            self.cfg.name,
            mail.recipient,
            len(mail.held),
            reason,
            attempts,
            last.detail,
        )

    # ------------------------------------------------------------------ SMTP

    def _connect(self) -> smtplib.SMTP:
        if self._smtp is None:
            c = self.cfg
            # The local host name as is: smtplib's default, getfqdn(), may wait on a reverse lookup.
            helo = socket.gethostname()
            smtp: smtplib.SMTP
            if c.tls == "implicit":
                smtp = smtplib.SMTP_SSL(
                    c.host, c.smtp_port, local_hostname=helo, timeout=c.timeout_s, context=self._tls
                )
            else:
                smtp = smtplib.SMTP(c.host, c.smtp_port, local_hostname=helo, timeout=c.timeout_s)
            try:
                if c.tls == "starttls":
                    smtp.starttls(context=self._tls)  # refuses (SMTPNotSupportedError) if not offered
                if c.username is not None:
                    assert self._password is not None
                    self._login(smtp, c.username, self._password)
            except BaseException:
                smtp.close()
                raise
            self._smtp = smtp
        return self._smtp

    @staticmethod
    def _login(smtp: smtplib.SMTP, username: str, password: str) -> None:
        """One mechanism, PLAIN or else LOGIN: smtplib's `login` tries every offered mechanism in
        turn, so a wrong password would count as several failures against lockout policies."""
        smtp.ehlo_or_helo_if_needed()
        offered = smtp.esmtp_features.get("auth", "").upper().split()
        mechanism = next((m for m in ("PLAIN", "LOGIN") if m in offered), None)
        if mechanism is None:  # let smtplib pick, or explain that there is nothing to pick
            smtp.login(username, password)
            return
        smtp.user, smtp.password = username, password
        authobject = smtp.auth_plain if mechanism == "PLAIN" else smtp.auth_login
        smtp.auth(mechanism, authobject, initial_response_ok=True)

    def _disconnect(self) -> None:
        if self._smtp is not None:
            try:
                self._smtp.quit()
            except (smtplib.SMTPException, OSError):
                self._smtp.close()
            self._smtp = None

    def send_once(self, recipient: str, message: EmailMessage) -> Attempt:
        """One attempt over the open session (or a new one), classified; never raises."""
        try:
            self._connect().send_message(message, self._envelope_from, [recipient])
            return Attempt("sent", "250")
        except smtplib.SMTPRecipientsRefused as exc:
            code, text = exc.recipients.get(recipient, (None, b""))
            return self._failed(code, text, "recipient refused")
        except smtplib.SMTPResponseException as exc:  # sender, data, login, greeting
            return self._failed(exc.smtp_code, exc.smtp_error, type(exc).__name__)
        except smtplib.SMTPNotSupportedError as exc:  # no STARTTLS, no AUTH: nothing a retry changes
            self._drop()
            return Attempt("permanent", f"SMTPNotSupportedError: {exc}"[:300])
        except (smtplib.SMTPException, OSError) as exc:  # refused, reset, timed out, TLS failed
            self._drop()
            return Attempt("transient", f"{type(exc).__name__}: {exc}"[:300])

    def _failed(self, code: int | None, text: bytes | str, what: str) -> Attempt:
        self._drop()
        msg = text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text)
        detail = f"SMTP {code} {msg} ({what})"[:300]
        permanent = code is not None and 500 <= code < 600
        return Attempt("permanent" if permanent else "transient", detail, code)

    def _drop(self) -> None:
        """After a failure the session's state is unknown: the next attempt starts a new one."""
        if self._smtp is not None:
            self._smtp.close()
            self._smtp = None

    # ------------------------------------------------------------------ the message

    def compose(self, recipient: str, alerts: Sequence[Alert]) -> EmailMessage:
        c = self.cfg
        bodies = [
            string.Template(c.template(c.body, a.type, DEFAULT_BODY)).substitute(alert_fields(a)).rstrip("\n")
            for a in alerts
        ]
        if len(alerts) == 1:
            a = alerts[0]
            subject = string.Template(c.template(c.subject, a.type, DEFAULT_SUBJECT)).substitute(
                alert_fields(a)
            )
            body = bodies[0] + "\n"
        else:
            fields = batch_fields(alerts)
            subject = string.Template(c.batch_subject or DEFAULT_BATCH_SUBJECT).substitute(fields)
            head = (
                f"{len(alerts)} alerts between {fields['first_time']} and {fields['last_time']} (UTC): "
                f"{fields['types']}\n"
            )
            body = head + SEPARATOR + SEPARATOR.join(bodies) + "\n"
        ids = [a.alert_id for a in alerts]
        msg = EmailMessage()
        msg["From"] = c.sender
        msg["To"] = recipient
        msg["Subject"] = " ".join(subject.split())  # one line whatever a zone id holds
        msg["Date"] = formatdate(usegmt=True)
        msg["Message-ID"] = message_id(c.name, recipient, ids, self._domain)
        msg[RECEIVER_HEADER] = c.name
        msg[COUNT_HEADER] = str(len(ids))
        if len(ids) <= MAX_IDS_IN_HEADER:
            msg[IDS_HEADER] = ", ".join(ids)
        msg.set_content(body)
        return msg
