"""`fleetfence infra`: the embedded Apache Kafka, Mosquitto and Redis (embedded.infra)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from cli.common import app, console, friendly_errors, settings_from_env
from embedded import infra

infra_app = typer.Typer(
    help="Embedded infrastructure: Apache Kafka (KRaft), Mosquitto, Redis.", no_args_is_help=True
)
app.add_typer(infra_app, name="infra")


def print_status(statuses: list[infra.ServiceStatus]) -> bool:
    table = Table(title="FleetFence infrastructure")
    for col in ("service", "address", "mode", "pid", "health", "detail"):
        table.add_column(col)
    for s in statuses:
        table.add_row(
            s.name,
            s.address,
            "embedded" if s.managed else "external",
            str(s.pid or "-"),
            "[green]healthy[/]" if s.healthy else "[red]DOWN[/]",
            s.detail,
        )
    Console().print(table)
    return all(s.healthy for s in statuses)


def _odd_quorum(n: int | None) -> int | None:
    if n is not None and n not in (1, 3, 5):
        raise typer.BadParameter(
            f"{n}: 1, or 3 or 5 (a KRaft quorum of an even size survives no more failures)"
        )
    return n


@infra_app.command("up")
@friendly_errors
def infra_up(
    kafka_brokers: Annotated[
        int | None,
        typer.Option(
            callback=_odd_quorum,
            help="Kafka nodes, each a broker and a KRaft controller voter: 1, or 3 or 5 for a cluster "
            "whose topics get 3 replicas, 2 in sync (default FLEETFENCE_KAFKA_BROKERS, 1). Export "
            "FLEETFENCE_KAFKA_BROKERS for the other commands, so their bootstrap lists every node.",
        ),
    ] = None,
) -> None:
    """Start the embedded services (those without an external endpoint) and create the topics."""
    s = settings_from_env() if kafka_brokers is None else settings_from_env(kafka_brokers=kafka_brokers)
    with console.status("starting Kafka, Mosquitto and Redis…"):
        statuses = infra.up(s)
    print_status(statuses)


@infra_app.command("down")
@friendly_errors
def infra_down() -> None:
    """Stop exactly the processes `infra up` started (data stays in the state folder)."""
    stopped = infra.down(settings_from_env())
    console.print(f"stopped: {', '.join(stopped) if stopped else 'nothing was running'}")


@infra_app.command("status")
@friendly_errors
def infra_status() -> None:
    """Show each service, its address and whether it answers a protocol round trip."""
    if not print_status(infra.status(settings_from_env())):
        raise typer.Exit(1)


@infra_app.command("restart")
@friendly_errors
def infra_restart(
    service: Annotated[
        str, typer.Argument(help=f"One of: {', '.join(infra.SERVICES)}; kafka-<i> for one node of a cluster.")
    ],
) -> None:
    """Restart one embedded service: SIGTERM (as `down` does), then start it again on its data."""
    s = settings_from_env()
    with console.status(f"restarting {service}…"):
        statuses = infra.restart(s, service)
    if not print_status(statuses):
        raise typer.Exit(1)


@infra_app.command("jars")
@friendly_errors
def infra_jars(
    bundles: Annotated[
        list[str] | None, typer.Argument(help="Bundles to fetch (default all: kafka, spark).")
    ] = None,
) -> None:
    """Fetch the JVM jars (the embedded Kafka broker, Spark's Kafka connector) with Maven, once,
    into the jar cache (FLEETFENCE_JAR_CACHE); later runs find them there offline."""
    from fleetfence import jars

    settings_from_env()
    for bundle in bundles or jars.BUNDLES:
        with console.status(f"fetching the {bundle} jars (Maven, first time only)…"):
            libs = jars.ensure_jars(bundle)
        version = jars.pom_property(bundle, f"{bundle}.version")
        print(f"{bundle} {version}: {len(libs)} jars in {jars.bundle_dir(bundle) / 'libs'}")
