"""Simulator publish throughput on private embedded infrastructure (broker, Mosquitto, Redis).

    .venv/bin/python bench/simulator.py                  # direct Kafka and MQTT, default sizes
    .venv/bin/python bench/simulator.py --vehicles 20000 --duration 30

Starts its own services on free ports under a temporary folder and stops them at the end. No
gateway runs, so MQTT figures are publisher -> Mosquitto PUBACK rates.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import uuid
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from embedded import infra  # noqa: E402
from fleetfence.contracts import utc_now_ms  # noqa: E402
from fleetfence.settings import Settings  # noqa: E402
from simulator.config import ScenarioConfig  # noqa: E402
from simulator.publish import SimulationOptions, run_simulation  # noqa: E402
from simulator.settings import SimulatorSettings  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vehicles", type=int, default=10_000)
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--mqtt-vehicles", type=int, default=1000)
    args = ap.parse_args()
    console = Console()
    with tempfile.TemporaryDirectory() as tmp:
        base = Settings(
            **infra.private_fields(Path(tmp)),
            topic_prefix=f"b{uuid.uuid4().hex[:6]}.",
        )
        infra.up(base)
        try:
            s = SimulatorSettings.from_base(base)
            table = Table(title="simulator throughput")
            for col in ("mode", "vehicles", "messages", "seconds", "msg/s", "errors"):
                table.add_column(col, justify="right")
            runs = [("direct", args.vehicles, True), ("mqtt", args.mqtt_vehicles, False)]
            for name, n, direct in runs:
                cfg = ScenarioConfig(vehicles=n, duration_s=args.duration, start_ms=utc_now_ms() - 3_600_000)
                rep = run_simulation(
                    s,
                    cfg,
                    SimulationOptions(direct=direct, register=False, truth_path=Path(tmp) / f"{name}.jsonl"),
                    console,
                )
                table.add_row(
                    name,
                    f"{n:,}",
                    f"{rep.messages:,}",
                    f"{rep.seconds:.1f}",
                    f"{rep.rate_msg_s:,.0f}",
                    str(rep.errors),
                )
            console.print(table)
        finally:
            infra.down(base)


if __name__ == "__main__":
    main()
