"""`fleetfence mqtt`: a production broker's identities (fleetfence.mqtt) and its TLS certificates.

`bootstrap` prepares what Mosquitto needs before its first start: the dynamic-security plugin's
file holding the admin account (FLEETFENCE_MQTT_ADMIN_PASSWORD) and, with --certs-dir, a small CA
and the server certificate of the vehicles' TLS listener. It never overwrites a file, so it can
run before every start of the broker (docker-compose.yml's `mqtt-bootstrap`); an existing file is
checked instead (the admin secret still the file's, the server key still the certificate's).
`accounts` creates the gateway's and the alert fan-out's accounts in the running broker, exactly
as `fleetfence infra up` does (embedded.infra.ensure_mqtt_accounts), for an installation that
does not run `infra up`. No secret is ever printed.
"""

from __future__ import annotations

import base64
import binascii
import grp
import hmac
import ipaddress
import json
import os
import pwd
import re
import stat
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli.common import app, console, friendly_errors, settings_from_env
from embedded import infra
from fleetfence.errors import ConfigError
from fleetfence.mqtt import SERVICE_KINDS, Account, DynSec, hash_password, service_account, write_bootstrap
from fleetfence.settings import Settings

if TYPE_CHECKING:
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric.rsa import RSAPrivateKey

mqtt_app = typer.Typer(
    help="MQTT identities and TLS of a production broker (Mosquitto's dynamic-security plugin).",
    no_args_is_help=True,
)
app.add_typer(mqtt_app, name="mqtt")

CA_CERT, CA_KEY, SERVER_CERT, SERVER_KEY = "ca.crt", "ca.key", "server.crt", "server.key"
MIN_SECRET_LEN = 16
RSA_BITS = 2048  # what every TLS stack of a vehicle tracker speaks
DNS_NAME_RE = re.compile(r"(\*\.)?([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
Owner = tuple[int, int]
IP = ipaddress.IPv4Address | ipaddress.IPv6Address


# --------------------------------------------------------------------------- small helpers


def parse_owner(text: str) -> Owner:
    """`UID[:GID]`, numbers or names (the broker's user: 1883:1883 in the eclipse-mosquitto image)."""
    user, _, group = text.partition(":")
    try:
        if user.isdigit():
            uid = gid = int(user)  # a bare number: the same group number, as in container images
        else:
            entry = pwd.getpwnam(user)
            uid, gid = entry.pw_uid, entry.pw_gid
        if group:
            gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
    except KeyError as exc:
        raise ConfigError(f"--owner {text!r}: no such user or group on this machine") from exc
    return uid, gid


def parse_hostnames(values: list[str]) -> tuple[list[str], list[IP]]:
    """The DNS names and IP addresses the vehicles reach the broker by (repeatable, or commas)."""
    names: list[str] = []
    ips: list[IP] = []
    for value in values:
        for raw in value.split(","):
            item = raw.strip().lower()
            if not item:
                continue
            try:
                ip = ipaddress.ip_address(item)
            except ValueError:
                if len(item) > 253 or not DNS_NAME_RE.fullmatch(item):
                    raise ConfigError(
                        f"--hostname {item!r} is neither a DNS name nor an IP address"
                    ) from None
                if item not in names:
                    names.append(item)
            else:
                if ip not in ips:
                    ips.append(ip)
    return names, ips


def _chown(path: Path, owner: Owner | None) -> None:
    if owner is None:
        return
    try:
        os.chown(path, *owner)
    except OSError as exc:  # not root, a read-only mount
        raise ConfigError(
            f"cannot hand {path} to uid {owner[0]} (run as root, or without --owner): {exc}"
        ) from exc


def _mkdirs(path: Path, mode: int, owner: Owner | None = None) -> None:
    """Create the missing folders up to `path` with this mode (whatever the umask) and owner;
    existing folders are left as they are."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for p in reversed(missing):
        try:
            p.mkdir()
            p.chmod(mode)
        except OSError as exc:
            raise ConfigError(f"cannot create {p}: {exc}") from exc
        _chown(p, owner)


def _write_new(path: Path, data: bytes, mode: int, owner: Owner | None = None) -> None:
    """Write a file that must not exist: a temporary file in the same folder, complete and with its
    mode and owner, then hard-linked to its name, which fails rather than replace a file."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    except OSError as exc:
        raise ConfigError(f"cannot write in {path.parent}: {exc}") from exc
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            if owner is not None:
                os.fchown(f.fileno(), *owner)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, path)
    except FileExistsError as exc:
        raise ConfigError(f"{path} appeared meanwhile: left as it is") from exc
    except OSError as exc:  # no permission, a read-only mount, a full disk
        raise ConfigError(f"cannot write {path}: {exc}") from exc
    finally:
        Path(tmp).unlink(missing_ok=True)


def _writable_by(folder: Path, owner: Owner) -> bool:
    st = folder.stat()
    uid, gid = owner
    return bool(
        (st.st_uid == uid and st.st_mode & stat.S_IWUSR)
        or (st.st_gid == gid and st.st_mode & stat.S_IWGRP)
        or st.st_mode & stat.S_IWOTH
    )


def admin_account(settings: Settings) -> Account:
    """The admin account a production broker is bootstrapped with: only from the settings."""
    if not settings.mqtt_auth:
        raise ConfigError("MQTT authentication is off (FLEETFENCE_MQTT_AUTH=false): nothing to bootstrap")
    secret = settings.mqtt_admin_password
    if secret is None:
        raise ConfigError(
            "set FLEETFENCE_MQTT_ADMIN_PASSWORD (the admin account's secret; every process that "
            "manages the broker's accounts, the admin API among them, needs the same value)"
        )
    if len(secret.get_secret_value()) < MIN_SECRET_LEN:
        raise ConfigError(
            f"FLEETFENCE_MQTT_ADMIN_PASSWORD is shorter than {MIN_SECRET_LEN} characters; generate one "
            "with: python3 -c 'import secrets; print(secrets.token_urlsafe(32))'"
        )
    return Account(settings.mqtt_admin_username, secret.get_secret_value())


# --------------------------------------------------------------------------- dynamic-security file


def check_admin(path: Path, admin: Account) -> None:
    """An existing dynamic-security file must hold the admin account with this very secret:
    otherwise nothing could manage the broker, and every service would fail later and less
    clearly."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"{path} exists but cannot be read as JSON ({exc}): restore it from a backup"
        ) from exc
    clients: list[dict[str, Any]] = data.get("clients", []) if isinstance(data, dict) else []
    entry = next((c for c in clients if c.get("username") == admin.username), None)
    if entry is None:
        raise ConfigError(
            f"{path} has no client {admin.username!r} (FLEETFENCE_MQTT_ADMIN_USERNAME changed after the "
            "first start?)"
        )
    try:
        salt = base64.b64decode(entry["salt"])
        stored = base64.b64decode(entry["password"])
        iterations = int(entry["iterations"])
    except (KeyError, ValueError, TypeError, binascii.Error) as exc:
        raise ConfigError(f"{path}: the client {admin.username!r} has no readable password hash") from exc
    computed = base64.b64decode(hash_password(admin.password, salt, iterations)["password"])
    if not hmac.compare_digest(computed, stored):
        raise ConfigError(
            f"FLEETFENCE_MQTT_ADMIN_PASSWORD is not the secret of {admin.username!r} in {path} (changed "
            "after the first start?): set the old one back, or change it in the broker first"
        )


def bootstrap_dynsec(path: Path, admin: Account, owner: Owner | None) -> None:
    if path.exists():
        check_admin(path, admin)
        if owner is not None:
            _chown(path, owner)
        print(f"kept      {path} (exists; its {admin.username!r} account has the configured secret)")
    else:
        _mkdirs(path.parent, 0o700, owner)  # the broker writes its file there
        try:
            write_bootstrap(path, admin)
        except OSError as exc:
            raise ConfigError(f"cannot write {path}: {exc}") from exc
        _chown(path, owner)
        print(f"wrote     {path} (the admin account {admin.username!r} and its role; mode 0600)")
    if owner is not None and not _writable_by(path.parent, owner):
        console.print(
            f"note: the broker (uid {owner[0]}) must be able to write in {path.parent}: Mosquitto rewrites "
            "the file there on every change (the eclipse-mosquitto image's entrypoint hands /mosquitto "
            "to its user at start)"
        )


# --------------------------------------------------------------------------- certificates


@dataclass(frozen=True)
class CertPlan:
    certs_dir: Path
    ca_key: Path
    names: list[str]
    ips: list[IP]
    days: int
    ca_days: int
    owner: Owner | None

    def path(self, name: str) -> Path:
        return self.certs_dir / name


def _require_cryptography() -> None:
    try:
        import cryptography  # noqa: F401
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise ConfigError(
            "certificates need the `cryptography` package (pip install cryptography); or put your own "
            f"{CA_CERT}, {SERVER_CERT} and {SERVER_KEY} in the certificates folder"
        ) from exc


def _new_key() -> RSAPrivateKey:
    from cryptography.hazmat.primitives.asymmetric import rsa

    return rsa.generate_private_key(public_exponent=65537, key_size=RSA_BITS)


def _key_pem(key: RSAPrivateKey) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return cert.public_bytes(serialization.Encoding.PEM)


def _fingerprint(cert: x509.Certificate) -> str:
    from cryptography.hazmat.primitives import hashes

    return cert.fingerprint(hashes.SHA256()).hex(":").upper()


def _validity(days: int) -> tuple[datetime, datetime]:
    now = datetime.now(UTC)
    return now - timedelta(minutes=5), now + timedelta(days=days)  # a little slack for skewed clocks


def make_ca(days: int) -> tuple[RSAPrivateKey, x509.Certificate]:
    """A CA that signs server certificates only (path length 0)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    key = _new_key()
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "FleetFence"),
            x509.NameAttribute(NameOID.COMMON_NAME, "FleetFence MQTT CA"),
        ]
    )
    start, end = _validity(days)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def make_server_cert(
    ca_key: RSAPrivateKey,
    ca_cert: x509.Certificate,
    names: list[str],
    ips: list[IP],
    days: int,
) -> tuple[RSAPrivateKey, x509.Certificate]:
    """The broker's certificate: every name and address in subjectAltName (clients check the host
    against it), the first name also as common name (for old TLS stacks that read only that)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = _new_key()
    cn = next((n for n in names if len(n) <= 64), "FleetFence MQTT broker")
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in names]
    sans += [x509.IPAddress(ip) for ip in ips]
    start, end = _validity(days)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(min(end, ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=True,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def _load_cert(path: Path) -> x509.Certificate:
    from cryptography import x509

    try:
        return x509.load_pem_x509_certificate(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} is not a PEM certificate: {exc}") from exc


def _load_key(path: Path) -> Any:
    from cryptography.hazmat.primitives import serialization

    try:
        return serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise ConfigError(f"{path} is not an unencrypted PEM private key: {exc}") from exc


def _same_key(key: Any, cert: x509.Certificate) -> bool:
    from cryptography.hazmat.primitives import serialization

    fmt = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return bool(key.public_key().public_bytes(*fmt) == cert.public_key().public_bytes(*fmt))


def _check_existing_server(plan: CertPlan) -> None:
    """Own or earlier certificates: the key must be the certificate's; the names and the issuer
    are only warned about (an own CA may have intermediates)."""
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature

    cert = _load_cert(plan.path(SERVER_CERT))
    if not _same_key(_load_key(plan.path(SERVER_KEY)), cert):
        raise ConfigError(f"{plan.path(SERVER_KEY)} is not the key of {plan.path(SERVER_CERT)}")
    ca = _load_cert(plan.path(CA_CERT))
    try:
        cert.verify_directly_issued_by(ca)
    except (InvalidSignature, ValueError, TypeError) as exc:
        console.print(f"note: {SERVER_CERT} is not signed by {CA_CERT} directly ({type(exc).__name__})")
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        have = {n.lower() for n in san.get_values_for_type(x509.DNSName)}
        have_ips = set(san.get_values_for_type(x509.IPAddress))
    except x509.ExtensionNotFound:
        have, have_ips = set(), set()
    missing = [n for n in plan.names if n not in have] + [str(ip) for ip in plan.ips if ip not in have_ips]
    if missing:
        console.print(
            f"[yellow]warning:[/] {plan.path(SERVER_CERT)} does not name {', '.join(missing)}: clients "
            f"dialling that will refuse it (move {SERVER_CERT} and {SERVER_KEY} away to get new ones)"
        )
    if cert.not_valid_after_utc < datetime.now(UTC) + timedelta(days=30):
        console.print(
            f"[yellow]warning:[/] {plan.path(SERVER_CERT)} expires on {cert.not_valid_after_utc:%Y-%m-%d}"
        )


def _fix_server_files(plan: CertPlan) -> None:
    """The broker reads its key after dropping root: hand the key (0600) and the certificates to it."""
    if plan.owner is None:
        return
    for name in (CA_CERT, SERVER_CERT, SERVER_KEY):
        _chown(plan.path(name), plan.owner)
    try:
        plan.path(SERVER_KEY).chmod(0o600)
    except OSError as exc:
        raise ConfigError(f"cannot make {plan.path(SERVER_KEY)} private (mode 0600): {exc}") from exc


def bootstrap_certs(plan: CertPlan) -> None:
    """ca.crt, server.crt, server.key in the folder (and the CA key at plan.ca_key), each written
    only when missing: a server certificate from the CA found there, or from a new CA."""
    _require_cryptography()
    _mkdirs(plan.certs_dir, 0o755, plan.owner)
    ca_crt, server_crt, server_key = plan.path(CA_CERT), plan.path(SERVER_CERT), plan.path(SERVER_KEY)
    if server_crt.exists() != server_key.exists():
        raise ConfigError(
            f"{plan.certs_dir} holds only one of {SERVER_CERT} and {SERVER_KEY}: complete the pair or "
            "remove it"
        )
    if server_crt.exists():
        if not ca_crt.exists():
            raise ConfigError(
                f"{ca_crt} is missing: put there the certificate of the CA that signed {SERVER_CERT} "
                "(the vehicles need it too)"
            )
        _check_existing_server(plan)
        _fix_server_files(plan)
        ca = _load_cert(ca_crt)
        print(f"kept      {ca_crt}, {server_crt}, {server_key} (exist)")
        print(f"CA        {ca.subject.rfc4514_string()}, SHA-256 {_fingerprint(ca)}")
        return
    if not plan.names and not plan.ips:
        raise ConfigError("--hostname is needed: the DNS names and IP addresses vehicles connect to")
    if ca_crt.exists() != plan.ca_key.exists():
        have, lack = (ca_crt, plan.ca_key) if ca_crt.exists() else (plan.ca_key, ca_crt)
        raise ConfigError(
            f"{have} exists but {lack} does not: a server certificate needs both the CA's certificate "
            f"and its key (or put your own {SERVER_CERT} and {SERVER_KEY} in {plan.certs_dir})"
        )
    if ca_crt.exists():
        ca_key, ca_cert = _load_key(plan.ca_key), _load_cert(ca_crt)
        if not _same_key(ca_key, ca_cert):
            raise ConfigError(f"{plan.ca_key} is not the key of {ca_crt}")
        print(f"kept      {ca_crt}, {plan.ca_key} (exist; signing with them)")
    else:
        ca_key, ca_cert = make_ca(plan.ca_days)
        _mkdirs(plan.ca_key.parent, 0o700)
        _write_new(plan.ca_key, _key_pem(ca_key), 0o600)  # never the broker's: it only signs
        _write_new(ca_crt, _cert_pem(ca_cert), 0o644, plan.owner)
        print(
            f"wrote     {plan.ca_key} (the CA's private key, mode 0600: keep it off the broker, back it up)"
        )
        print(f"wrote     {ca_crt} (the CA certificate: give it to every vehicle)")
    key, cert = make_server_cert(ca_key, ca_cert, plan.names, plan.ips, plan.days)
    _write_new(server_key, _key_pem(key), 0o600, plan.owner)
    _write_new(server_crt, _cert_pem(cert), 0o644, plan.owner)
    _fix_server_files(plan)  # an own ca.crt too
    names = ", ".join([*plan.names, *map(str, plan.ips)])
    until = f"{cert.not_valid_after_utc:%Y-%m-%d}"
    print(f"wrote     {server_key} (mode 0600), {server_crt} (for {names}, until {until})")
    print(f"CA        {ca_cert.subject.rfc4514_string()}, SHA-256 {_fingerprint(ca_cert)}")


# --------------------------------------------------------------------------- commands


@mqtt_app.command("bootstrap")
@friendly_errors
def mqtt_bootstrap(
    dynsec_file: Annotated[
        Path | None,
        typer.Argument(
            help="The plugin's file (plugin_opt_config_file in mosquitto.conf), written when missing; "
            "leave it out for certificates only (the embedded broker writes its own)."
        ),
    ] = None,
    certs_dir: Annotated[
        Path | None,
        typer.Option(help=f"Also the TLS files here: {CA_CERT}, {SERVER_CERT}, {SERVER_KEY} (when missing)."),
    ] = None,
    hostname: Annotated[
        list[str] | None,
        typer.Option(help="A DNS name or IP address vehicles connect to (repeat, or separate by commas)."),
    ] = None,
    ca_key: Annotated[
        Path | None,
        typer.Option(
            help=f"The CA's private key (default: {CA_KEY} in --certs-dir); keep it off the broker."
        ),
    ] = None,
    days: Annotated[int, typer.Option(min=1, max=3650, help="Validity of a new server certificate.")] = 825,
    ca_days: Annotated[int, typer.Option(min=1, max=36500, help="Validity of a new CA.")] = 3650,
    owner: Annotated[
        str | None,
        typer.Option(
            help="UID[:GID] the broker runs as (1883:1883 in eclipse-mosquitto): it gets the "
            "dynamic-security file and the server's key and certificates (needs root)."
        ),
    ] = None,
) -> None:
    """The first dynamic-security file of a production broker, with the admin account of the
    settings, and (--certs-dir, --hostname) a CA and a server certificate for TLS. Existing files
    are kept and checked, never overwritten: run it before every start of the broker."""
    s = settings_from_env()
    if certs_dir is None and (hostname or ca_key):
        raise ConfigError("--hostname and --ca-key need --certs-dir")
    if dynsec_file is None and certs_dir is None:
        raise ConfigError("nothing to do: give the dynamic-security file, --certs-dir, or both")
    names, ips = parse_hostnames(hostname or [])
    who = parse_owner(owner) if owner else None
    if dynsec_file is not None:
        bootstrap_dynsec(dynsec_file, admin_account(s), who)
    if certs_dir is not None:
        plan = CertPlan(certs_dir, ca_key or certs_dir / CA_KEY, names, ips, days, ca_days, who)
        bootstrap_certs(plan)


@mqtt_app.command("accounts")
@friendly_errors
def mqtt_accounts(
    update_secrets: Annotated[
        bool,
        typer.Option(
            "--update-secrets",
            help="Also give existing accounts the configured secrets (after changing them); a service "
            "connected with the old one is disconnected at once.",
        ),
    ] = False,
) -> None:
    """The gateway's and the alert fan-out's accounts and roles in the running broker, as
    `fleetfence infra up` creates them (idempotent; an existing account keeps its secret unless
    --update-secrets)."""
    s = settings_from_env()
    if not s.mqtt_auth:
        raise ConfigError("MQTT authentication is off (FLEETFENCE_MQTT_AUTH=false): no accounts to create")
    if s.mqtt_external:
        unset = [
            f"FLEETFENCE_MQTT_{k.upper()}_PASSWORD"
            for k in SERVICE_KINDS
            if getattr(s, f"mqtt_{k}_password") is None
        ]
        if unset:
            raise ConfigError(f"an external broker's accounts come from the settings: set {', '.join(unset)}")
    host, port = s.mqtt_host_port
    with console.status(f"creating the service accounts on mqtt://{host}:{port}…"):
        infra.ensure_mqtt_accounts(s)
    services = [a for k in ("gateway", "alerts") if (a := service_account(s, k)) is not None]
    if update_secrets:
        control = DynSec.from_settings(s)
        try:
            for account in services:
                control.set_password(account.username, account.password)
        finally:
            control.close()
    done = "present, secrets updated" if update_secrets else "present"
    print(f"accounts  {', '.join(a.username for a in services)} {done} on mqtt://{host}:{port}")
