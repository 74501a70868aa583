"""`fleetfence mqtt bootstrap` and `fleetfence mqtt accounts`: the production broker's first
dynamic-security file and TLS files, written once and checked afterwards, never printed secrets;
and the production Mosquitto config (deploy/mosquitto.conf) really run, on loopback, with what the
command wrote: a vehicle logs in over TLS with credentials issued through the admin account,
anonymous and wrong logins are refused, the gateway's account receives the vehicle's telemetry and
the compose health check logs in."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import pwd
import re
import shutil
import socket
import ssl
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.x509.oid import ExtendedKeyUsageOID
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode
from typer.testing import CliRunner, Result

from cli.app import app
from cli.mqtt import parse_hostnames
from embedded.infra import dynsec_plugin
from fleetfence.contracts import telemetry_topic
from fleetfence.errors import ConfigError, MissingBinaryError
from fleetfence.mqtt import Account, DynSec, check_admin
from fleetfence.pki import make_ca
from fleetfence.probes import free_port
from fleetfence.testing import wait_for

ROOT = Path(__file__).resolve().parents[2]
ADMIN_SECRET = "admin-Secret-0123456789abcdef"
GATEWAY_SECRET = "gateway-Secret-0123456789abcdef"
ALERTS_SECRET = "alerts-Secret-0123456789abcdef"
ADMIN = "fleetfence-admin"  # the settings' default username


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, str]:
    """A clean FleetFence environment: none of the caller's settings, the admin secret set."""
    for key in list(os.environ):
        if key.startswith("FLEETFENCE_"):
            monkeypatch.delenv(key)
    return {
        "FLEETFENCE_STATE_DIR": str(tmp_path / "state"),
        "FLEETFENCE_MQTT_ADMIN_PASSWORD": ADMIN_SECRET,
        "NO_COLOR": "1",
    }


def run(env: dict[str, str], *args: str | Path) -> Result:
    result = CliRunner().invoke(app, ["mqtt", *map(str, args)], env=env)
    for secret in (ADMIN_SECRET, GATEWAY_SECRET, ALERTS_SECRET):
        assert secret not in result.output, "a secret was printed"
    return result


def said(result: Result, text: str) -> bool:
    """Whether the output says `text`, whatever rich's line wrapping did to it (it folds long
    paths anywhere, so whitespace is ignored on both sides)."""
    return "".join(text.split()) in "".join(result.output.split())


def load_cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


# --------------------------------------------------------------------------- the dynamic-security file


def test_bootstrap_writes_the_admin_account_once_then_checks_it(env: dict[str, str], tmp_path: Path) -> None:
    path = tmp_path / "broker" / "dynamic-security.json"
    first = run(env, "bootstrap", path)
    assert first.exit_code == 0, first.output
    assert said(first, f"wrote {path}")
    assert mode(path) == 0o600
    data = json.loads(path.read_text())
    assert [c["username"] for c in data["clients"]] == [ADMIN]
    assert data["defaultACLAccess"]["subscribe"] is False
    assert data["defaultACLAccess"]["publishClientSend"] is False
    check_admin(path, Account(ADMIN, ADMIN_SECRET))  # the hash is the configured secret's
    with pytest.raises(ConfigError, match="not the secret"):
        check_admin(path, Account(ADMIN, ADMIN_SECRET + "x"))

    before = path.read_bytes()
    again = run(env, "bootstrap", path)
    assert again.exit_code == 0, again.output
    assert said(again, f"kept {path}")
    assert path.read_bytes() == before, "an existing file was rewritten"

    changed = run({**env, "FLEETFENCE_MQTT_ADMIN_PASSWORD": "another-secret-0123456789"}, "bootstrap", path)
    assert changed.exit_code == 2
    assert said(changed, "is not the secret of 'fleetfence-admin'")
    renamed = run({**env, "FLEETFENCE_MQTT_ADMIN_USERNAME": "ops-admin"}, "bootstrap", path)
    assert renamed.exit_code == 2
    assert said(renamed, "has no client 'ops-admin'")
    assert path.read_bytes() == before


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"FLEETFENCE_MQTT_ADMIN_PASSWORD": ""}, "shorter than 16 characters"),
        ({"FLEETFENCE_MQTT_ADMIN_PASSWORD": "short"}, "shorter than 16 characters"),
        ({"FLEETFENCE_MQTT_AUTH": "false"}, "MQTT authentication is off"),
    ],
)
def test_bootstrap_refuses_without_a_proper_admin_secret(
    env: dict[str, str], tmp_path: Path, extra: dict[str, str], message: str
) -> None:
    path = tmp_path / "dynamic-security.json"
    result = run({**env, **extra}, "bootstrap", path)
    assert result.exit_code == 2
    assert said(result, message)
    assert not path.exists()


def test_bootstrap_without_any_admin_secret(env: dict[str, str], tmp_path: Path) -> None:
    env = {k: v for k, v in env.items() if k != "FLEETFENCE_MQTT_ADMIN_PASSWORD"}
    result = run(env, "bootstrap", tmp_path / "dynamic-security.json")
    assert result.exit_code == 2
    assert said(result, "set FLEETFENCE_MQTT_ADMIN_PASSWORD")


root_only = pytest.mark.skipif(os.geteuid() != 0, reason="hands files to another uid: root only")
BROKER_UID = "1883:1883"  # eclipse-mosquitto's user; no entry in this machine's /etc/passwd needed


def owner_of(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_uid, st.st_gid


@root_only
def test_bootstrap_hands_the_data_folder_to_the_broker(env: dict[str, str], broker_dir: Path) -> None:
    """The compose volume's case: the folder exists root:root 0755 before the first bootstrap
    (Docker made the mount point), and the broker writes its persistence file in it."""
    data = broker_dir / "data"
    data.mkdir()
    data.chmod(0o755)
    path = data / "dynamic-security.json"
    first = run(env, "bootstrap", path, "--owner", BROKER_UID)
    assert first.exit_code == 0, first.output
    assert said(first, f"gave {data} to uid 1883 gid 1883 (was owner 0:0, mode 0755)")
    assert said(first, f"checked {data}: the broker can create its files there (owner 1883:1883, mode 0755)")
    assert owner_of(data) == owner_of(path) == (1883, 1883)
    assert sorted(p.name for p in data.iterdir()) == [path.name], "the check left a file behind"

    # A deployment bootstrapped before the folder was handed over: its file is the broker's, the
    # folder and a persistence file (from a broker that once ran as root) are not.
    os.chown(data, 0, 0)
    (data / "mosquitto.db").write_bytes(b"")
    again = run(env, "bootstrap", path, "--owner", BROKER_UID)
    assert again.exit_code == 0, again.output
    assert said(again, f"kept {path}")
    assert said(again, f"gave {data}")
    assert owner_of(data) == owner_of(data / "mosquitto.db") == (1883, 1883)

    third = run(env, "bootstrap", path, "--owner", BROKER_UID)
    assert third.exit_code == 0, third.output
    assert not said(third, "gave"), "nothing was left to hand over"


@root_only
def test_bootstrap_fails_when_the_broker_cannot_create_files_in_its_folder(
    env: dict[str, str], tmp_path: Path
) -> None:
    """tmp_path is private to root: a broker running as uid 1883 could not reach a folder in it,
    however the folder itself is owned; the bootstrap says so and fails, before the broker starts."""
    data = tmp_path / "data"
    result = run(env, "bootstrap", data / "dynamic-security.json", "--owner", BROKER_UID)
    assert result.exit_code == 2, result.output
    assert said(result, f"wrote {data / 'dynamic-security.json'}"), "the steps before are reported"
    assert said(
        result, f"the broker (uid 1883, gid 1883) cannot create a file in {data} (owner 1883:1883, mode 0700)"
    )
    assert said(result, "Permission denied")
    assert said(result, "It cannot pass through")
    assert not said(result, "Traceback")


# --------------------------------------------------------------------------- certificates


def test_hostnames_are_dns_names_or_addresses() -> None:
    names, ips = parse_hostnames(["MQTT.example.com, 203.0.113.7", "::1,mqtt.example.com", "*.fleet.example"])
    assert names == ["mqtt.example.com", "*.fleet.example"]
    assert ips == [ipaddress.ip_address("203.0.113.7"), ipaddress.ip_address("::1")]
    for bad in ("under_score.example", "-lead.example", "a..b", "x" * 64 + ".example"):
        with pytest.raises(ConfigError, match="neither a DNS name nor an IP address"):
            parse_hostnames([bad])


def test_certificates_name_every_host_and_are_written_once(env: dict[str, str], tmp_path: Path) -> None:
    certs, ca_key = tmp_path / "certs", tmp_path / "ca" / "ca.key"
    args = ("bootstrap", tmp_path / "dynsec.json", "--certs-dir", certs, "--ca-key", ca_key)
    result = run(env, *args, "--hostname", "mqtt.example.com,203.0.113.7", "--hostname", "localhost")
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in certs.iterdir()) == ["ca.crt", "server.crt", "server.key"]
    assert mode(ca_key) == 0o600
    assert mode(ca_key.parent) == 0o700
    assert mode(certs / "server.key") == 0o600
    assert mode(certs / "server.crt") == 0o644
    assert mode(certs / "ca.crt") == 0o644

    ca, server = load_cert(certs / "ca.crt"), load_cert(certs / "server.crt")
    server.verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not server.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["mqtt.example.com", "localhost"]
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("203.0.113.7")]
    eku = server.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    key = serialization.load_pem_private_key((certs / "server.key").read_bytes(), password=None)
    assert key.public_key() == server.public_key()
    assert said(result, ca.fingerprint(hashes.SHA256()).hex(":").upper())

    before = {p.name: p.read_bytes() for p in [*certs.iterdir(), ca_key]}
    again = run(env, *args, "--hostname", "other.example.com")
    assert again.exit_code == 0, again.output
    assert said(again, "kept")
    assert said(again, "does not name other.example.com")
    assert {p.name: p.read_bytes() for p in [*certs.iterdir(), ca_key]} == before

    needs_dir = run(env, "bootstrap", tmp_path / "dynsec.json", "--hostname", "x.example")
    assert needs_dir.exit_code == 2
    assert said(needs_dir, "need --certs-dir")


def test_the_device_edge_gets_a_copy_of_the_server_pair_that_follows_it(
    env: dict[str, str], tmp_path: Path
) -> None:
    """The compose gateways serve vehicles the broker's certificate but run as their own user, who
    cannot read the broker's key: bootstrap copies the pair for them, and copies it again when the
    broker's pair is replaced (a renewal), never leaving a stale key behind."""
    certs, edge = tmp_path / "certs", tmp_path / "edge"
    args = ("bootstrap", "--certs-dir", certs, "--hostname", "localhost", "--edge-certs-dir", edge)
    first = run(env, *args)
    assert first.exit_code == 0, first.output
    for name, m in (("server.crt", 0o644), ("server.key", 0o600)):
        assert (edge / name).read_bytes() == (certs / name).read_bytes()
        assert mode(edge / name) == m
    assert sorted(p.name for p in edge.iterdir()) == ["server.crt", "server.key"]
    assert said(first, "copied")

    again = run(env, *args)
    assert again.exit_code == 0, again.output
    assert not said(again, "copied"), "an equal copy is kept"

    # The broker's pair renewed: the next bootstrap replaces the copy.
    for name in ("server.crt", "server.key"):
        (certs / name).unlink()
    renewed = run(env, *args)
    assert renewed.exit_code == 0, renewed.output
    assert (edge / "server.key").read_bytes() == (certs / "server.key").read_bytes()
    assert sorted(p.name for p in edge.iterdir()) == ["server.crt", "server.key"]

    alone = run(env, "bootstrap", tmp_path / "d.json", "--edge-certs-dir", edge)
    assert alone.exit_code == 2
    assert said(alone, "need --certs-dir")


def test_certificates_alone_need_no_admin_secret(env: dict[str, str], tmp_path: Path) -> None:
    env = {k: v for k, v in env.items() if k != "FLEETFENCE_MQTT_ADMIN_PASSWORD"}
    result = run(env, "bootstrap", "--certs-dir", tmp_path / "certs", "--hostname", "localhost")
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "certs").iterdir()) == [
        "ca.crt", "ca.key", "server.crt", "server.key",
    ]  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["certs"]
    nothing = run(env, "bootstrap")
    assert nothing.exit_code == 2
    assert said(nothing, "nothing to do")
    no_names = run(env, "bootstrap", "--certs-dir", tmp_path / "more")
    assert no_names.exit_code == 2
    assert said(no_names, "--hostname is needed")
    blocked = run(
        env, "bootstrap", "--certs-dir", tmp_path / "certs" / "ca.crt" / "x", "--hostname", "a.example"
    )
    assert blocked.exit_code == 2, blocked.output  # one readable line, no traceback
    assert said(blocked, "cannot create")


def test_an_own_ca_signs_the_server_certificate(env: dict[str, str], tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    certs.mkdir()
    key, cert = make_ca(30)
    (certs / "ca.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "own.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    ca_before = (certs / "ca.crt").read_bytes()
    result = run(
        env, "bootstrap", tmp_path / "d.json", "--certs-dir", certs, "--ca-key", tmp_path / "own.key",
        "--hostname", "localhost",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert (certs / "ca.crt").read_bytes() == ca_before
    load_cert(certs / "server.crt").verify_directly_issued_by(cert)


def test_incomplete_certificate_folders_are_refused(env: dict[str, str], tmp_path: Path) -> None:
    def attempt(files: dict[str, bytes]) -> str:
        d = Path(tempfile.mkdtemp(dir=tmp_path))
        for name, data in files.items():
            (d / name).write_bytes(data)
        result = run(env, "bootstrap", d / "d.json", "--certs-dir", d, "--hostname", "localhost")
        assert result.exit_code == 2, result.output
        assert sorted(p.name for p in d.iterdir()) == sorted([*files, "d.json"]), "a file was added"
        return "".join(result.output.split())

    ca_key, ca = make_ca(30)
    other_key, _ = make_ca(30)
    pem = ca.public_bytes(serialization.Encoding.PEM)

    def key_pem(k: Any) -> bytes:
        return bytes(
            k.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )

    assert "holdsonlyoneofserver.crtandserver.key" in attempt({"server.crt": pem})
    assert "ca.crtexistsbut" in attempt({"ca.crt": pem})
    assert "ca.keyexistsbut" in attempt({"ca.key": key_pem(ca_key)})
    assert "ca.crtismissing" in attempt({"server.crt": pem, "server.key": key_pem(ca_key)})
    assert "ca.keyisnotthekeyof" in attempt({"ca.crt": pem, "ca.key": key_pem(other_key)})
    both = {"ca.crt": pem, "server.crt": pem, "server.key": key_pem(other_key)}
    assert "server.keyisnotthekeyof" in attempt(both)


# --------------------------------------------------------------------------- the deploy config, running


def adapted_config(data: Path, certs: Path, plain: int, tls: int) -> str:
    """deploy/mosquitto.conf with this machine's plugin, the test's folders and loopback ports;
    every rewrite must apply, so a reshaped config fails here rather than test something else."""
    text = (ROOT / "deploy" / "mosquitto.conf").read_text()
    rewrites = [
        (r"^listener 1883$", f"listener {plain} 127.0.0.1"),
        (r"^listener 8883$", f"listener {tls} 127.0.0.1"),
        (r"^plugin /usr/lib/mosquitto_dynamic_security\.so$", f"plugin {dynsec_plugin()}"),
        (r"/mosquitto/data/", f"{data}/"),
        (r"/mosquitto/certs/", f"{certs}/"),
    ]
    for pattern, repl in rewrites:
        text, n = re.subn(pattern, repl, text, flags=re.MULTILINE)
        assert n, f"deploy/mosquitto.conf has no {pattern!r}"
    assert "/mosquitto/" not in text
    return text


def connectable(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
        return True
    return False


class Session:
    """A paho MQTT 5 client whose connect, PUBACK and message outcomes tests wait on."""

    def __init__(self, username: str | None, password: str | None) -> None:
        self.connack: list[ReasonCode] = []
        self.pubacks: dict[int, ReasonCode] = {}
        self.messages: list[mqtt.MQTTMessage] = []
        self.subscribed = threading.Event()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        if username is not None:
            self.client.username_pw_set(username, password)
        self.client.reconnect_delay_set(30, 30)  # no retries while the test looks
        self.client.on_connect = lambda _c, _u, _f, rc, _p=None: self.connack.append(rc)
        self.client.on_publish = self._on_publish
        self.client.on_subscribe = lambda *_a: self.subscribed.set()
        self.client.on_message = lambda _c, _u, m: self.messages.append(m)

    def _on_publish(self, _c: Any, _u: Any, mid: int, rc: ReasonCode, _p: Properties) -> None:
        self.pubacks[mid] = rc

    def start(self, host: str, port: int) -> ReasonCode:
        self.client.connect(host, port, keepalive=10)
        self.client.loop_start()
        return wait_for(lambda: self.connack[0] if self.connack else None, 10, f"CONNACK from {port}")

    def publish(self, topic: str) -> ReasonCode:
        info = self.client.publish(topic, b'{"lat": 0}', qos=1)
        return wait_for(lambda: self.pubacks.get(info.mid), 10, f"PUBACK for {topic}")

    def stop(self) -> None:
        self.client.loop_stop()
        with contextlib.suppress(Exception):
            self.client.disconnect()


@pytest.fixture
def broker_dir() -> Iterator[Path]:
    """A folder the broker can reach after dropping root (pytest's are private to their owner)."""
    d = Path(tempfile.mkdtemp(prefix="fleetfence-mqtt-deploy-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_deploy_config_serves_vehicles_over_tls_with_bootstrapped_files(
    env: dict[str, str], broker_dir: Path
) -> None:
    binary = shutil.which("mosquitto") or (
        "/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else None
    )
    if binary is None:
        pytest.skip("mosquitto is not installed")
    try:
        dynsec_plugin()
    except MissingBinaryError:
        pytest.skip("Mosquitto's dynamic-security plugin is not installed")
    # As root, Mosquitto drops to its user: the files go to that user, as in the compose file.
    owner = ["--owner", "mosquitto"] if os.geteuid() == 0 and _has_user("mosquitto") else []
    data, certs = broker_dir / "data", broker_dir / "certs"
    # The data folder exists before the bootstrap, as the compose volume's mount point does (root's,
    # when root runs this): the bootstrap must hand it to the broker, or it persists nothing.
    data.mkdir(mode=0o755)
    result = run(
        env, "bootstrap", data / "dynamic-security.json", "--certs-dir", certs,
        "--ca-key", broker_dir / "ca" / "ca.key", "--hostname", "localhost,127.0.0.1", *owner,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    plain, tls = free_port(), free_port()
    conf = broker_dir / "mosquitto.conf"
    conf.write_text(adapted_config(data, certs, plain, tls))
    log = broker_dir / "mosquitto.log"
    sessions: list[Session] = []
    with log.open("wb") as out:
        proc = subprocess.Popen([binary, "-c", str(conf)], stdout=out, stderr=subprocess.STDOUT)
    try:

        def listening() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"mosquitto exited {proc.returncode}: {log.read_text()}")
            return connectable(plain) and connectable(tls)

        wait_for(listening, 10, "both listeners")

        # The init step's accounts, as for an external broker; the vehicle's through the admin account.
        accounts_env = {
            **env,
            "FLEETFENCE_MQTT_URL": f"mqtt://127.0.0.1:{plain}",
            "FLEETFENCE_MQTT_GATEWAY_PASSWORD": GATEWAY_SECRET,
            "FLEETFENCE_MQTT_ALERTS_PASSWORD": ALERTS_SECRET,
        }
        assert (
            run({**env, "FLEETFENCE_MQTT_URL": accounts_env["FLEETFENCE_MQTT_URL"]}, "accounts").exit_code
            == 2
        )
        made = run(accounts_env, "accounts")
        assert made.exit_code == 0, made.output
        control = DynSec("127.0.0.1", plain, Account(ADMIN, ADMIN_SECRET))
        try:
            control.create_vehicle("veh-tls-1", "vehicle-secret-0123456789")
        finally:
            control.close()

        gateway = Session("fleetfence-gateway", GATEWAY_SECRET)
        sessions.append(gateway)
        assert not gateway.start("127.0.0.1", plain).is_failure
        gateway.client.subscribe("fleet/+/telemetry", qos=1)
        wait_for(gateway.subscribed.is_set, 10, "the gateway's SUBACK")

        vehicle = Session("veh-tls-1", "vehicle-secret-0123456789")
        sessions.append(vehicle)
        vehicle.client.tls_set(ca_certs=str(certs / "ca.crt"))
        assert not vehicle.start("localhost", tls).is_failure
        sock = vehicle.client.socket()
        assert isinstance(sock, ssl.SSLSocket)
        assert sock.version() in ("TLSv1.2", "TLSv1.3")
        assert not vehicle.publish(telemetry_topic("veh-tls-1")).is_failure
        assert vehicle.publish(telemetry_topic("veh-tls-2")).value == 135  # not its topic
        got = wait_for(lambda: gateway.messages, 10, "the vehicle's fix at the gateway")
        assert [m.topic for m in got] == [telemetry_topic("veh-tls-1")]

        for username, password in ((None, None), ("veh-tls-1", "wrong-secret-0123456789")):
            refused = Session(username, password)
            sessions.append(refused)
            refused.client.tls_set(ca_certs=str(certs / "ca.crt"))
            assert refused.start("127.0.0.1", tls).value == 135  # SAN has the address too

        untrusting = Session("veh-tls-1", "vehicle-secret-0123456789")
        untrusting.client.tls_set()  # the system's CAs: our CA is not among them
        with pytest.raises(ssl.SSLCertVerificationError):
            untrusting.client.connect("localhost", tls)

        # The compose health check, as the container's shell runs it (on the test's port).
        health = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["mosquitto"]
        kind, command = health["healthcheck"]["test"]
        assert kind == "CMD-SHELL"
        command = command.replace("$$", "$").replace("-p 1883", f"-p {plain}")
        if shutil.which("mosquitto_pub"):
            for secret, ok in ((ADMIN_SECRET, True), ("wrong-secret-0123456789", False)):
                check = subprocess.run(
                    ["sh", "-c", command],
                    env={"PATH": os.environ["PATH"], "FLEETFENCE_MQTT_ADMIN_PASSWORD": secret},
                    capture_output=True,
                    timeout=10,
                    check=False,
                )
                assert (check.returncode == 0) == ok, check

        # The broker persists: its file in the data folder after an autosave, no error saying why not.
        conf_lines = conf.read_text().splitlines()
        autosave = int(next(line.split()[1] for line in conf_lines if line.startswith("autosave_interval ")))
        persisted = data / "mosquitto.db"
        wait_for(persisted.exists, 3 * autosave + 5, f"{persisted} written by the broker", interval_s=0.5)
        if owner:
            user = pwd.getpwnam("mosquitto")
            assert owner_of(persisted) == owner_of(data) == (user.pw_uid, user.pw_gid)
        assert not re.search(r"^\d+: Error: ", log.read_text(), re.MULTILINE), log.read_text()
    finally:
        for s in sessions:
            s.stop()
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def test_the_embedded_broker_serves_vehicles_over_tls(env: dict[str, str], tmp_path: Path) -> None:
    """FLEETFENCE_MQTT_TLS_PORT: the embedded Mosquitto's second listener, TLS with the files of
    `fleetfence mqtt bootstrap --certs-dir`, the same accounts as the plain one."""
    from embedded import infra
    from embedded.processes import stop_one
    from fleetfence.mqtt import embedded_accounts
    from fleetfence.probes import mqtt_ping, wait_until
    from fleetfence.settings import Settings

    s = Settings(
        **infra.private_fields(tmp_path / "embedded"), mqtt_tls_port=free_port(), mqtt_tls_host="127.0.0.1"
    )
    certs = s.mqtt_dir / "certs"
    with pytest.raises(ConfigError, match="lacks"):
        infra.start_mqtt(s)  # no certificates yet: refused with the command that makes them
    assert run(env, "bootstrap", "--certs-dir", certs, "--hostname", "127.0.0.1").exit_code == 0
    proc = infra.start_mqtt(s)
    vehicle = None
    try:
        admin = embedded_accounts(s)["admin"]
        host, port = s.mqtt_host_port
        wait_until(
            lambda: mqtt_ping(host, port, account=admin), 30, "Mosquitto", proc, s.mqtt_dir / "mosquitto.log"
        )
        control = DynSec(host, port, admin)
        try:
            control.create_vehicle("tls-truck", "tls-secret")
        finally:
            control.close()
        vehicle = Session("tls-truck", "tls-secret")
        vehicle.client.tls_set(ca_certs=str(certs / "ca.crt"))
        assert vehicle.start("127.0.0.1", int(s.mqtt_tls_port or 0)).getName() == "Success"
        assert not vehicle.publish(telemetry_topic("tls-truck")).is_failure
        assert vehicle.publish(telemetry_topic("another-truck")).getName() == "Not authorized"
    finally:
        if vehicle is not None:
            vehicle.stop()
        stop_one(s, "mqtt")
