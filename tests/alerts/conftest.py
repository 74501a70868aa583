"""The alert receivers' fixtures: a local HTTP webhook target and local SMTP servers."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator

import pytest
from cryptography.hazmat.primitives import serialization

from fleetfence.pki import make_ca, make_server_cert
from tests.alerts.helpers import SmtpServer, TlsFiles, WebhookTarget


@pytest.fixture
def target() -> Iterator[WebhookTarget]:
    t = WebhookTarget().start()
    yield t
    t.stop()


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    """A CA and a server certificate for localhost and 127.0.0.1 (fleetfence.pki), made once."""
    folder = tmp_path_factory.mktemp("smtp-tls")
    ca_key, ca = make_ca(days=2)
    key, cert = make_server_cert(ca_key, ca, ["localhost"], [ipaddress.IPv4Address("127.0.0.1")], days=1)
    files = TlsFiles(folder / "ca.crt", folder / "server.crt", folder / "server.key")
    files.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return files


@pytest.fixture
def smtp_server(tls_files: TlsFiles) -> Iterator[SmtpServer]:
    """STARTTLS on a plain port, AUTH required."""
    s = SmtpServer(tls_files, "starttls").start()
    yield s
    s.stop()


@pytest.fixture
def smtps_server(tls_files: TlsFiles) -> Iterator[SmtpServer]:
    """Implicit TLS (the port speaks TLS from the first byte), AUTH required."""
    s = SmtpServer(tls_files, "implicit").start()
    yield s
    s.stop()
