"""The MQTT broker's TLS files: a small CA and the server certificate of the vehicles' listener.

Vehicle trackers verify the broker against a CA they were given once, so the CA outlives many
server certificates: `bootstrap_certs` signs a new server certificate with the CA it finds (or an
own one), creates a CA only when there is none, and never overwrites a file; an existing server
pair is checked instead (the key still the certificate's). The CA's key stays off the broker: only
the server's key is handed to the broker's user.

`cryptography` is imported where it is used, so the command line starts without it.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetfence.errors import ConfigError
from fleetfence.files import Owner, Report, chown, make_dirs, write_new

if TYPE_CHECKING:
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric.rsa import RSAPrivateKey

CA_CERT, CA_KEY, SERVER_CERT, SERVER_KEY = "ca.crt", "ca.key", "server.crt", "server.key"
RSA_BITS = 2048  # what every TLS stack of a vehicle tracker speaks
IP = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class CertPlan:
    """What `bootstrap_certs` makes: the folder the broker reads, where the CA's key lives, the
    names and addresses vehicles dial, the validity of new certificates, the broker's user."""

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
    """An unencrypted PKCS#8 PEM key: the broker reads it unattended."""
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return cert.public_bytes(serialization.Encoding.PEM)


def _fingerprint(cert: x509.Certificate) -> str:
    """SHA-256, colon-separated: what `openssl x509 -fingerprint -sha256` prints to compare."""
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


def _check_existing_server(plan: CertPlan, report: Report) -> None:
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
        report.note(f"{SERVER_CERT} is not signed by {CA_CERT} directly ({type(exc).__name__})")
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        have = {n.lower() for n in san.get_values_for_type(x509.DNSName)}
        have_ips = set(san.get_values_for_type(x509.IPAddress))
    except x509.ExtensionNotFound:
        have, have_ips = set(), set()
    missing = [n for n in plan.names if n not in have] + [str(ip) for ip in plan.ips if ip not in have_ips]
    if missing:
        report.warning(
            f"{plan.path(SERVER_CERT)} does not name {', '.join(missing)}: clients "
            f"dialling that will refuse it (move {SERVER_CERT} and {SERVER_KEY} away to get new ones)"
        )
    if cert.not_valid_after_utc < datetime.now(UTC) + timedelta(days=30):
        report.warning(f"{plan.path(SERVER_CERT)} expires on {cert.not_valid_after_utc:%Y-%m-%d}")


def _fix_server_files(plan: CertPlan) -> None:
    """The broker reads its key after dropping root: hand the key (0600) and the certificates to it."""
    if plan.owner is None:
        return
    for name in (CA_CERT, SERVER_CERT, SERVER_KEY):
        chown(plan.path(name), plan.owner)
    try:
        plan.path(SERVER_KEY).chmod(0o600)
    except OSError as exc:
        raise ConfigError(f"cannot make {plan.path(SERVER_KEY)} private (mode 0600): {exc}") from exc


def bootstrap_certs(plan: CertPlan, report: Report) -> None:
    """ca.crt, server.crt, server.key in the folder (and the CA key at plan.ca_key), each written
    only when missing: a server certificate from the CA found there, or from a new CA."""
    _require_cryptography()
    make_dirs(plan.certs_dir, 0o755, plan.owner)
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
        _check_existing_server(plan, report)
        _fix_server_files(plan)
        ca = _load_cert(ca_crt)
        report.step("kept", f"{ca_crt}, {server_crt}, {server_key} (exist)")
        report.step("CA", f"{ca.subject.rfc4514_string()}, SHA-256 {_fingerprint(ca)}")
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
        report.step("kept", f"{ca_crt}, {plan.ca_key} (exist; signing with them)")
    else:
        ca_key, ca_cert = make_ca(plan.ca_days)
        make_dirs(plan.ca_key.parent, 0o700)
        write_new(plan.ca_key, _key_pem(ca_key), 0o600)  # never the broker's: it only signs
        write_new(ca_crt, _cert_pem(ca_cert), 0o644, plan.owner)
        report.step(
            "wrote", f"{plan.ca_key} (the CA's private key, mode 0600: keep it off the broker, back it up)"
        )
        report.step("wrote", f"{ca_crt} (the CA certificate: give it to every vehicle)")
    key, cert = make_server_cert(ca_key, ca_cert, plan.names, plan.ips, plan.days)
    write_new(server_key, _key_pem(key), 0o600, plan.owner)
    write_new(server_crt, _cert_pem(cert), 0o644, plan.owner)
    _fix_server_files(plan)  # an own ca.crt too
    names = ", ".join([*plan.names, *map(str, plan.ips)])
    until = f"{cert.not_valid_after_utc:%Y-%m-%d}"
    report.step("wrote", f"{server_key} (mode 0600), {server_crt} (for {names}, until {until})")
    report.step("CA", f"{ca_cert.subject.rfc4514_string()}, SHA-256 {_fingerprint(ca_cert)}")


def copy_server_pair(certs_dir: Path, to_dir: Path, owner: Owner | None, report: Report) -> None:
    """The broker's server certificate and key, copied for another server that presents the same
    names: FleetFence's device edge (`gateway.edge`) runs as its own user and cannot read the
    broker's key (0600, the broker's). The copy follows the pair: a copy that differs (the pair
    renewed or replaced) is replaced, atomically, and one that is equal is kept."""
    for name in (SERVER_CERT, SERVER_KEY):
        if not (certs_dir / name).is_file():
            raise ConfigError(f"{certs_dir / name} is missing: nothing to copy to {to_dir}")
    make_dirs(to_dir, 0o755, owner)
    for name, mode in ((SERVER_CERT, 0o644), (SERVER_KEY, 0o600)):
        src, dst = certs_dir / name, to_dir / name
        data = src.read_bytes()
        if dst.is_file() and dst.read_bytes() == data:
            chown(dst, owner)
            dst.chmod(mode)
            report.step("kept", f"{dst} (the same as {src})")
            continue
        tmp = to_dir / f".{name}.new"
        tmp.unlink(missing_ok=True)
        write_new(tmp, data, mode, owner)
        tmp.replace(dst)
        report.step("copied", f"{src} to {dst} (mode {mode:04o})")
