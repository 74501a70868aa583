"""Report output formats: JSON-ready rows and GeoJSON (H3 cells of the heatmap, zone visits), for
the API and the CLI alike."""

from __future__ import annotations

from typing import Any

import h3
import numpy as np
import pandas as pd

from fleetfence.contracts import ms_to_iso


def records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """JSON-ready rows: NaN/NA -> None, numpy scalars -> Python, `*_ts_ms` get an ISO twin `*_ts`."""
    rows: list[dict[str, Any]] = []
    ts_cols = [c for c in df.columns if c.endswith("_ts_ms")]
    for row in df.astype(object).where(df.notna(), None).to_dict(orient="records"):
        clean = {str(k): (v.item() if isinstance(v, np.generic) else v) for k, v in row.items()}
        for c in ts_cols:
            v = clean[c]
            clean[c[: -len("_ms")]] = None if v is None else ms_to_iso(int(v))
        rows.append(clean)
    return rows


def heatmap_geojson(df: pd.DataFrame, resolution: int) -> dict[str, Any]:
    features = []
    for row in records(df):
        ring = [[lng, lat] for lat, lng in h3.cell_to_boundary(row["h3_cell"])]
        ring.append(ring[0])
        features.append(
            {
                "type": "Feature",
                "id": row["h3_cell"],
                "geometry": {"type": "Polygon", "coordinates": [ring]},
                "properties": {**row, "resolution": resolution},
            }
        )
    return {"type": "FeatureCollection", "features": features}


def visits_geojson(df: pd.DataFrame) -> dict[str, Any]:
    """One Point feature per visit, at the first fix inside the zone."""
    features = [
        {
            "type": "Feature",
            "geometry": {"type": "Point", "coordinates": [row["entry_lon"], row["entry_lat"]]},
            "properties": row,
        }
        for row in records(df)
    ]
    return {"type": "FeatureCollection", "features": features}
