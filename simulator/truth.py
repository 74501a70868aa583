"""Ground truth: the alerts a correct processor must emit for a scenario, as JSON lines.

The first line is the run header (`{"run": {...}}`: vehicle id scheme, event-time span, rules the
truth assumed); every other line is one expected alert. `verify` scopes the observed alerts to the
header's vehicles and event-time span, so alerts of earlier runs on the same topic do not count.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

import orjson

from fleetfence.contracts import alert_id
from fleetfence.errors import ConfigError


def vehicle_id(prefix: str, index: int) -> str:
    return f"{prefix}{index:06d}"


@dataclass(slots=True)
class TruthAlert:
    """One expected alert. `seq`/`ts_ms` are those the processor must put on the alert: the
    triggering fix's, or for VEHICLE_SILENT the last fix's seq and the due time. `publish_ms` is
    the wall-clock time the fix that made it due was handed to MQTT/Kafka (real-time runs only);
    `lat`/`lon` where the triggering fix was published (None for a silence: no fix triggers it).
    A pair's alert (vehicle proximity) names the other vehicle (`other_vehicle_id`, which takes the
    zone's place in `key`) and its id's `subject` (the rule, the other vehicle, when the nearness
    began: `fleetfence.contracts.alert_record`)."""

    vehicle_id: str
    type: str
    seq: int
    ts_ms: int
    zone_id: str | None = None
    publish_tick: int = -1
    publish_ms: int | None = None
    lat: float | None = None
    lon: float | None = None
    other_vehicle_id: str | None = None
    subject: str | None = None

    @property
    def key(self) -> tuple[str, str, str, int]:
        """A pair's alert is keyed by its rule and the other vehicle (its subject without when the
        nearness began), in the zone's place (simulator.verify.ObservedAlert.key)."""
        pair = self.subject.rsplit(":", 1)[0] if self.other_vehicle_id and self.subject else ""
        return (self.vehicle_id, self.type, self.zone_id or pair, self.seq)

    @property
    def alert_id(self) -> str:
        return alert_id(self.vehicle_id, self.type, self.seq, self.zone_id or self.subject or "")

    def to_json(self) -> bytes:
        d = asdict(self)
        d.pop("publish_tick")
        d["alert_id"] = self.alert_id
        return orjson.dumps(d)


@dataclass(frozen=True)
class RunHeader:
    vehicle_prefix: str
    n_vehicles: int
    start_ms: int
    end_ms: int
    period_ms: int
    seed: int
    realtime: bool
    assumptions: dict[str, Any]

    def vehicle_ids(self) -> set[str]:
        return {vehicle_id(self.vehicle_prefix, i) for i in range(self.n_vehicles)}


class TruthWriter:
    """Streams truth lines to a file (a 100k-vehicle run never holds them all in memory)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = path.with_suffix(path.suffix + ".part")
        self._f: IO[bytes] = self._tmp.open("wb")
        self.count = 0

    def write(self, alerts: Iterable[TruthAlert]) -> None:
        for a in alerts:
            self._f.write(a.to_json() + b"\n")
            self.count += 1

    def close(self, header: RunHeader) -> None:
        """Prepend the header (known only at the end: the event-time span) and move into place."""
        self._f.close()
        with self.path.open("wb") as out, self._tmp.open("rb") as body:
            out.write(orjson.dumps({"run": asdict(header)}) + b"\n")
            while chunk := body.read(1 << 20):
                out.write(chunk)
        self._tmp.unlink()


def read_truth(path: Path) -> tuple[RunHeader, list[TruthAlert]]:
    if not path.is_file():
        raise ConfigError(f"ground truth file {path} does not exist")
    header: RunHeader | None = None
    alerts: list[TruthAlert] = []
    for line in _lines(path):
        d = orjson.loads(line)
        if "run" in d:
            header = RunHeader(**d["run"])
            continue
        alerts.append(
            TruthAlert(
                d["vehicle_id"],
                d["type"],
                int(d["seq"]),
                int(d["ts_ms"]),
                d.get("zone_id"),
                -1,
                d.get("publish_ms"),
                d.get("lat"),
                d.get("lon"),
                d.get("other_vehicle_id"),
                d.get("subject"),
            )
        )
    if header is None:
        raise ConfigError(f"{path} has no run header line: not a `fleetfence simulate` ground truth")
    return header, alerts


def _lines(path: Path) -> Iterator[bytes]:
    with path.open("rb") as f:
        for line in f:
            if line.strip():
                yield line
