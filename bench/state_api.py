"""The job's stateful operator under `applyInPandasWithState`, and Spark's floor, for bench/latency.py.

The job runs `GeofenceProcessor` under `transformWithStateInPandas`: three value states per bucket
(the vehicles blob, the master blob, a digest and timer) and an event-time timer, each state call a
round trip from the Python worker to the JVM's state server. `applyInPandasWithState` is the older
API: one state row per group, shipped to Python in the same Arrow stream as the group's data and
written back whole after every call, and one event-time timeout. This module is that operator for
the same bucketed state and the same fold (`processor.spark.stateful.bucket_step`), so that
`bench/latency.py --variant base --variant gs:state_api=applyInPandasWithState` measures the two
APIs side by side on the live job, and nothing else differs.

The floor (`state_api=floor`) is the job's query with a stateful function that does nothing but emit
one alert per fix through the same exactly-once sink (`floor-quiet`: nothing but a count): Spark's
own cost for this query shape (the connector's read, the shuffle by bucket, the Python operator's
round trip, the sink's transaction), which no geofencing can go below. `--variant base --variant
floor:state_api=floor` puts the job's latency beside it in one run.

Neither is the product: the job keeps `transformWithStateInPandas`, which alone takes a re-bucketed
checkpoint's seed as initial state and writes the master blob only when the master data changes.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any

import pandas as pd

from fleetfence.errors import ConfigError
from processor.core.domain import EngineConfig
from processor.settings import ProcessorSettings

STATE_DDL = "vehicles binary, master binary, digest string"
APPLY_IN_PANDAS_WITH_STATE = "applyInPandasWithState"
# Spark's floor: the job's query shape around a stateful function that does no geofencing.
FLOOR = "floor"  # one alert per fix: what latency is read from
FLOOR_QUIET = "floor-quiet"  # no alerts, one counters row per bucket: the throughput floor
FLOOR_ALERT_TYPE = "FLOOR"
STATE_APIS = ("transformWithState", APPLY_IN_PANDAS_WITH_STATE, FLOOR, FLOOR_QUIET)


def fold_group(cfg: EngineConfig) -> Any:
    """The per-bucket function for `applyInPandasWithState`: the state row is (vehicles blob, master
    blob, master digest); a timed-out bucket runs with no data, like a fired timer in the job."""
    from processor.spark.stateful import bucket_step, cached_master, catalog_for

    def fold(key: Any, frames: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
        wm = max(int(state.getCurrentWatermarkMs()), 0)
        if state.hasTimedOut:
            df = None
        else:
            parts = list(frames)
            df = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
        vehicles, master_blob, digest = (
            (bytes(state.get[0]), bytes(state.get[1]), state.get[2]) if state.exists else (None, b"", "")
        )
        master = cached_master(digest, lambda: master_blob)
        step = bucket_step(vehicles, master, digest, df, wm, cfg, catalog_for(cfg))
        state.update(
            (step.vehicles, step.master_blob if step.master_blob is not None else master_blob, step.digest)
        )
        if step.next_timer_ms > 0:
            # The API refuses a timeout behind the watermark; one at it fires in the next batch.
            state.setTimeoutTimestamp(max(step.next_timer_ms, wm, 1))
        yield step.out

    return fold


def start_group_state_query(
    spark: Any, s: ProcessorSettings, query_name: str = "fleetfence-processor"
) -> Any:
    """The job (`processor.spark.job.start_query`) with its stateful operator under
    `applyInPandasWithState` and an event-time timeout: the job's own input and sink around it."""
    from pyspark.sql.streaming.state import GroupStateTimeout

    from processor.spark.job import job_input, start_output
    from processor.spark.rows import OUTPUT_DDL

    inp = job_input(spark, s, s.checkpoint, s.processor_starting_offsets)
    if inp.seed is not None:
        raise ConfigError(f"{s.checkpoint} is re-bucketed: only the job's own operator reads its seed")
    out = inp.grouped.applyInPandasWithState(
        fold_group(s.engine_config()),
        outputStructType=OUTPUT_DDL,
        stateStructType=STATE_DDL,
        outputMode="Append",
        timeoutConf=GroupStateTimeout.EventTimeTimeout,
    )
    return start_output(spark, out, s, inp, query_name)


def start_floor_query(
    spark: Any, s: ProcessorSettings, query_name: str = "fleetfence-floor", *, alerts: bool = True
) -> Any:
    """Spark's own floor under the job: the job's input (both topics through Spark's Kafka
    connector, grouped by bucket with the watermark) and its exactly-once sink, with a
    `transformWithStateInPandas` operator that only turns each fix into one alert (`floor_rows`),
    or with `alerts` off only counts them (one counters row per bucket, as the job's: the sink
    still commits its transaction and markers every batch). What the job costs above this is the
    geofencing and its state, the part this project owns; the alert per fix is there to read
    event→alert latency from, and at full load it is a load of its own (a record per event)."""
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    from processor.spark.job import job_input, start_output
    from processor.spark.rows import OUTPUT_DDL

    # Defined in here so that Spark pickles them by value: `bench` is not a package the Python
    # workers can import.
    def floor_rows(df: pd.DataFrame) -> pd.DataFrame:
        """One alert row per fix of the bucket's chunks, and nothing else: no state read or written,
        no master data, no geometry. Its record carries what the latency is read from
        (`trigger_received_ms`), under a type of its own so it is never mistaken for the job's."""
        import orjson

        from processor.spark.rows import InputKind, OutputKind, OutputRow, decode_chunks, output_frame

        fixes = decode_chunks(df.loc[df["kind"] == InputKind.FIXES, "payload"].tolist())
        if not alerts:
            stats = OutputRow(OutputKind.STATS, orjson.dumps({"accepted": len(fixes)}))
            return output_frame([stats])
        rows = [
            OutputRow(
                OutputKind.ALERT,
                orjson.dumps(
                    {
                        "alert_id": f"{vid}:{seq}",
                        "type": FLOOR_ALERT_TYPE,
                        "vehicle_id": vid,
                        "seq": seq,
                        "ts_ms": ts,
                        "trigger_received_ms": received,
                    }
                ),
                vehicle_id=vid,
                seq=seq,
            )
            for vid, seq, ts, received in zip(
                fixes.vehicle_id.tolist(),
                fixes.seq.tolist(),
                fixes.ts_ms.tolist(),
                fixes.received_ms.tolist(),
                strict=True,
            )
        ]
        return output_frame(rows)

    class FloorProcessor(StatefulProcessor):
        def init(self, handle: Any) -> None:
            pass

        def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[pd.DataFrame]:
            frames = list(rows)
            yield floor_rows(pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0])

        def close(self) -> None:
            pass

    inp = job_input(spark, s, s.checkpoint, s.processor_starting_offsets)
    if inp.seed is not None:
        raise ConfigError(f"{s.checkpoint} is re-bucketed: only the job's own operator reads its seed")
    out = inp.grouped.transformWithStateInPandas(
        statefulProcessor=FloorProcessor(),
        outputStructType=OUTPUT_DDL,
        outputMode="Append",
        timeMode="EventTime",
    )
    return start_output(spark, out, s, inp, query_name)


def starter(state_api: str) -> Any:
    """The function that starts the query of `state_api` (one of STATE_APIS)."""
    from processor.spark.job import start_query

    return {
        "transformWithState": start_query,
        APPLY_IN_PANDAS_WITH_STATE: start_group_state_query,
        FLOOR: start_floor_query,
        FLOOR_QUIET: partial(start_floor_query, alerts=False),
    }[state_api]
