"""`fleetfence mqtt`: a production broker's identities (fleetfence.mqtt) and its TLS certificates
(fleetfence.pki); the commands parse their options and print, the work is done there.

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

import grp
import ipaddress
import pwd
import re
from pathlib import Path
from typing import Annotated

import typer

from cli.common import app, console, friendly_errors, settings_from_env
from embedded import infra
from fleetfence.errors import ConfigError
from fleetfence.files import Owner
from fleetfence.mqtt import SERVICE_KINDS, DynSec, admin_account, bootstrap_dynsec, service_account
from fleetfence.pki import (
    CA_CERT,
    CA_KEY,
    IP,
    SERVER_CERT,
    SERVER_KEY,
    CertPlan,
    bootstrap_certs,
    copy_server_pair,
)

mqtt_app = typer.Typer(
    help="MQTT identities and TLS of a production broker (Mosquitto's dynamic-security plugin).",
    no_args_is_help=True,
)
app.add_typer(mqtt_app, name="mqtt")

DNS_NAME_RE = re.compile(r"(\*\.)?([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")


class Printed:
    """The bootstraps' report on the terminal: each file written or kept on stdout, in columns;
    notes and warnings on stderr."""

    def step(self, verb: str, text: str) -> None:
        print(f"{verb:<10}{text}")

    def note(self, text: str) -> None:
        console.print(f"note: {text}")

    def warning(self, text: str) -> None:
        console.print(f"[yellow]warning:[/] {text}")


# --------------------------------------------------------------------------- options


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
    edge_certs_dir: Annotated[
        Path | None,
        typer.Option(
            help=f"Also copy {SERVER_CERT} and {SERVER_KEY} here, for the device edge (the gateways "
            "vehicles connect to), replacing a copy that differs."
        ),
    ] = None,
    edge_owner: Annotated[
        str | None,
        typer.Option(help="UID[:GID] the gateways run as (10001:10001 in FleetFence's images)."),
    ] = None,
) -> None:
    """The first dynamic-security file of a production broker, with the admin account of the
    settings, and (--certs-dir, --hostname) a CA and a server certificate for TLS. Existing files
    are kept and checked, never overwritten: run it before every start of the broker."""
    s = settings_from_env()
    if certs_dir is None and (hostname or ca_key or edge_certs_dir):
        raise ConfigError("--hostname, --ca-key and --edge-certs-dir need --certs-dir")
    if edge_owner and edge_certs_dir is None:
        raise ConfigError("--edge-owner needs --edge-certs-dir")
    if dynsec_file is None and certs_dir is None:
        raise ConfigError("nothing to do: give the dynamic-security file, --certs-dir, or both")
    names, ips = parse_hostnames(hostname or [])
    who = parse_owner(owner) if owner else None
    if dynsec_file is not None:
        bootstrap_dynsec(dynsec_file, admin_account(s), who, Printed())
    if certs_dir is not None:
        plan = CertPlan(certs_dir, ca_key or certs_dir / CA_KEY, names, ips, days, ca_days, who)
        bootstrap_certs(plan, Printed())
        if edge_certs_dir is not None:
            edge_who = parse_owner(edge_owner) if edge_owner else None
            copy_server_pair(certs_dir, edge_certs_dir, edge_who, Printed())


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
