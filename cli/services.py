"""The long-running services: `fleetfence api`, `master-relay`, `apikey`, `gateway`, `processor`."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from cli.common import app, console, friendly_errors, settings_from_env
from fleetfence.logs import configure_logging

apikey_app = typer.Typer(help="API keys of the admin API (stored hashed in Redis).", no_args_is_help=True)
app.add_typer(apikey_app, name="apikey")


@app.command("api")
@friendly_errors
def api(
    host: Annotated[str | None, typer.Option(help="Default: FLEETFENCE_API_HOST.")] = None,
    port: Annotated[int | None, typer.Option(help="Default: FLEETFENCE_API_PORT.")] = None,
    workers: Annotated[int | None, typer.Option(help="Default: FLEETFENCE_API_WORKERS.")] = None,
) -> None:
    """Serve the admin API (with the outbox relay inside unless FLEETFENCE_API_RUN_RELAY=false)."""
    import socket

    import uvicorn

    from admin_api.settings import ApiSettings
    from fleetfence.metrics import http_url
    from fleetfence.registry import announce

    s = ApiSettings()
    configure_logging(s.log_level, s.log_json)
    host, port = host or s.api_host, port or s.api_port
    # The launcher announces the API in the service registry (`fleetfence status`): one entry per
    # listening address, whatever the number of uvicorn workers behind it.
    with announce(
        s,
        "api",
        f"{socket.gethostname()}:{port}",
        metrics_url=http_url(host, port, "/metrics"),
        health_url=http_url(host, port, "/healthz"),
    ):
        uvicorn.run(
            "admin_api.app:create_app",
            factory=True,
            host=host,
            port=port,
            workers=workers or s.api_workers,
            log_config=None,
            access_log=False,
        )


@app.command("master-relay")
@friendly_errors
def master_relay() -> None:
    """Publish the vehicle master's outbox to fleet.master until SIGTERM/SIGINT."""
    from fleetfence.service import stop_on_signals
    from vehicle_master.relay import OutboxRelay
    from vehicle_master.settings import MasterSettings

    s = MasterSettings()
    configure_logging(s.log_level, s.log_json)
    relay = OutboxRelay(s)
    try:
        with stop_on_signals() as stop:
            relay.run_forever(stop)
    finally:
        relay.stop()


@apikey_app.command("create")
@friendly_errors
def apikey_create(
    name: Annotated[str, typer.Argument(help="A unique name, e.g. ops-dashboard.")],
    role: Annotated[str, typer.Option(help="admin (read and write) or viewer (read only).")] = "viewer",
) -> None:
    """Create an API key and print it once (only its hash is stored)."""
    import redis

    from admin_api.errors import ApiKeyError
    from admin_api.security import Role, create_api_key

    s = settings_from_env()
    if role not in {r.value for r in Role}:
        raise ApiKeyError(f"role must be admin or viewer, got {role!r}")
    r = redis.Redis.from_url(s.redis_dsn)
    try:
        key = create_api_key(r, s.redis_prefix, name, Role(role))
    finally:
        r.close()
    console.print(f"created {role} key [bold]{name}[/]; store it now, it is not shown again:")
    print(key)


@apikey_app.command("list")
@friendly_errors
def apikey_list() -> None:
    """List key names and roles (never the keys)."""
    import redis

    from admin_api.security import list_api_keys

    s = settings_from_env()
    r = redis.Redis.from_url(s.redis_dsn)
    try:
        keys = list_api_keys(r, s.redis_prefix)
    finally:
        r.close()
    table = Table(title="API keys")
    for col in ("name", "role", "created_ms"):
        table.add_column(col)
    for k in keys:
        table.add_row(k["name"], k.get("role", "?"), k.get("created_ms", "?"))
    Console().print(table)


@apikey_app.command("revoke")
@friendly_errors
def apikey_revoke(name: Annotated[str, typer.Argument(help="The key's name.")]) -> None:
    """Revoke a key (the API stops accepting it within FLEETFENCE_API_KEY_CACHE_S)."""
    import redis

    from admin_api.security import revoke_api_key

    s = settings_from_env()
    r = redis.Redis.from_url(s.redis_dsn)
    try:
        revoke_api_key(r, s.redis_prefix, name)
    finally:
        r.close()
    console.print(f"revoked {name}")


# --------------------------------------------------------------------------- gateway


@app.command("gateway")
@friendly_errors
def gateway_cmd() -> None:
    """Run one gateway replica (MQTT -> Kafka) until SIGTERM/Ctrl-C, then drain what is in flight."""
    from gateway.__main__ import run
    from gateway.settings import GatewaySettings

    settings = GatewaySettings()
    configure_logging(settings.log_level, settings.log_json)
    if not run(settings):
        raise typer.Exit(1)


# --------------------------------------------------------------------------- processor


@app.command("processor")
@friendly_errors
def processor_cmd(
    standby: Annotated[
        bool,
        typer.Option(
            "--standby",
            help="A warm standby: start Spark and its Python workers, then wait for the checkpoint's "
            "lease and take over the moment the active driver's lease expires.",
        ),
    ] = False,
    hot: Annotated[
        bool,
        typer.Option(
            "--hot",
            help="A hot driver: run the job on a checkpoint of its own all the time, commit alerts only "
            "while holding the job's lease, and take over at the next batch (docs/exactly-once.md).",
        ),
    ] = False,
) -> None:
    """Run the PySpark geofencing job (FLEETFENCE_PROCESSOR_* settings) until Ctrl-C/SIGTERM."""
    from processor.ops.service import serve
    from processor.settings import ProcessorSettings

    s = ProcessorSettings()
    if standby or hot:
        s = s.model_copy(
            update={
                "processor_standby": s.processor_standby or standby,
                "processor_hot": s.processor_hot or hot,
            }
        )
    configure_logging(s.log_level, s.log_json)
    serve(s)


@app.command("rebucket")
@friendly_errors
def rebucket_cmd(
    to: Annotated[str, typer.Option("--to", help="The new checkpoint location (empty or absent).")],
    buckets: Annotated[int, typer.Option("--buckets", min=1, max=4096, help="Its bucket count.")],
) -> None:
    """Move the processor checkpoint's state (FLEETFENCE_PROCESSOR_CHECKPOINT) to a new bucket count
    in a new checkpoint, offline: the processor must be stopped (processor.spark.rebucket)."""
    from processor.ops.rebucket_run import run_rebucket
    from processor.settings import ProcessorSettings

    s = ProcessorSettings()
    configure_logging(s.log_level, s.log_json)
    seed = run_rebucket(s, to, buckets)
    console.print(
        f"[green]re-bucketed[/] {seed.vehicles:,} vehicles at batch {seed.batch_id} of {seed.source} "
        f"into {buckets} buckets at {to}; the old checkpoint is retired.\n"
        f"Start the processor with FLEETFENCE_PROCESSOR_CHECKPOINT={to} "
        f"FLEETFENCE_PROCESSOR_BUCKETS={buckets}."
    )


# --------------------------------------------------------------------------- simulator
