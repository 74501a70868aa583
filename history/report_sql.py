"""The reports' SQL for SedonaDB (history.reports runs it; definitions and tolerances in
docs/reports.md). One statement per report over the `enriched` view, with the window-function runs
they share; placeholders in braces are filled by the runner (bounds, constants, the vehicle
filter)."""

# Fixes in range with their route (as of the fix) and the corridor test. The corridor is built once
# per route version exactly like processor.core.geometry.compile_route: the line is mapped into metres
# around its centroid (LocalProjection, an affine map), buffered by half the width with quad_segs=4,
# and mapped back to lon/lat. The test is a SedonaDB spatial join (R-tree over the corridors,
# prepared point-in-polygon refinement) of each fix against the corridor of its own route version;
# the route equality is written as a CASE so the planner keeps the spatial join and applies it as
# the join filter (a plain equality would turn it into a hash join that tests every fix against an
# unprepared polygon). At most one corridor matches a fix, so the LEFT join keeps one row per fix.
ENRICHED_SQL = """
WITH rv AS (
    SELECT route_id, version, from_ms, to_ms, speed_limit_kmh,
           ST_Affine(ST_Buffer(ST_Affine(line, kx, 0.0, 0.0, ky, -lon0 * kx, -lat0 * ky),
                               corridor_width_m / 2.0, 'quad_segs=4'),
                     1.0 / kx, 0.0, 0.0, 1.0 / ky, lon0, lat0) AS corridor
    FROM (
        SELECT r.*, {ky} * cos(radians(lat0)) AS kx, {ky} AS ky
        FROM (
            SELECT route_id, version, from_ms, to_ms, corridor_width_m, speed_limit_kmh,
                   ST_GeomFromWKB(line_wkb) AS line,
                   ST_X(ST_Centroid(ST_GeomFromWKB(line_wkb))) AS lon0,
                   ST_Y(ST_Centroid(ST_GeomFromWKB(line_wkb))) AS lat0
            FROM routes
        ) r
    ) p
),
fx AS (
    SELECT vehicle_id, seq, ts_ms, lon, lat, speed_kmh,
           row_number() OVER w AS rn,
           lead(ts_ms) OVER w AS next_ts,
           lead(lon) OVER w AS next_lon,
           lead(lat) OVER w AS next_lat
    FROM telemetry
    WHERE ts_ms >= {from_ms} AND ts_ms < {to_ms} {vehicle_filter}
    WINDOW w AS (PARTITION BY vehicle_id ORDER BY ts_ms, seq)
),
fa AS (
    SELECT f.*, a.route_id
    FROM fx f LEFT JOIN assignments a
      ON f.vehicle_id = a.vehicle_id AND f.ts_ms >= a.from_ms AND f.ts_ms < a.to_ms
),
fr AS (
    SELECT fa.*, rv.version AS route_version, rv.speed_limit_kmh
    FROM fa LEFT JOIN rv
      ON fa.route_id = rv.route_id AND fa.ts_ms >= rv.from_ms AND fa.ts_ms < rv.to_ms
)
SELECT fr.vehicle_id, fr.seq, fr.ts_ms, fr.lon, fr.lat, fr.speed_kmh, fr.rn, fr.next_ts, fr.next_lon,
       fr.next_lat, fr.route_id, fr.route_version, fr.speed_limit_kmh,
       CASE WHEN fr.route_version IS NULL THEN NULL ELSE c.route_id IS NOT NULL END AS inside
FROM fr LEFT JOIN rv c
  ON ST_Contains(c.corridor, ST_Point(fr.lon, fr.lat))
 AND (CASE WHEN c.route_id = fr.route_id AND c.version = fr.route_version THEN 1 ELSE 0 END) = 1
"""

# Haversine metres from a fix to the next one (same formula and radius as fleetfence.geo.haversine_m).
HAVERSINE_NEXT_SQL = (
    "2.0 * {r} * asin(sqrt(power(sin(radians(next_lat - lat) / 2.0), 2) + "
    "cos(radians(lat)) * cos(radians(next_lat)) * power(sin(radians(next_lon - lon) / 2.0), 2)))"
)

ADHERENCE_SQL = """
SELECT vehicle_id, ts_ms / {day_ms} AS day, count(*) AS fixes, count(inside) AS assigned_fixes,
       sum(CASE WHEN inside THEN 1 ELSE 0 END) AS inside_fixes,
       sum(CASE WHEN NOT inside AND next_ts IS NOT NULL THEN next_ts - ts_ms ELSE 0 END) / 1000.0
           AS off_route_s,
       sum(CASE WHEN NOT inside AND next_ts IS NOT NULL THEN {haversine} ELSE 0.0 END) AS off_route_m
FROM enriched
GROUP BY vehicle_id, ts_ms / {day_ms}
ORDER BY vehicle_id, day
"""

# Gaps and islands: within a run, rn - (row number among the matching fixes) is constant.
# A circle zone's polygon only contains its disc (a pre-filter); inside is the processor's test,
# within radius_m of the centre in the centre's local projection (fleetfence.geo.circle_distance_m:
# the same metres per degree, computed once per zone in Python, and the same formula).
ZONE_VISITS_SQL = """
WITH zv AS (
    SELECT zone_id, from_ms, to_ms, ST_GeomFromWKB(poly_wkb) AS poly, cx, cy, kx, ky, radius_m FROM zones
),
zf AS (
    SELECT f.vehicle_id, z.zone_id, f.rn, f.ts_ms, f.next_ts, f.lon, f.lat
    FROM enriched f JOIN zv z
      ON ST_Contains(z.poly, ST_Point(f.lon, f.lat)) AND f.ts_ms >= z.from_ms AND f.ts_ms < z.to_ms
         AND (z.radius_m IS NULL
              OR sqrt(((f.lon - z.cx) * z.kx) * ((f.lon - z.cx) * z.kx)
                      + ((f.lat - z.cy) * z.ky) * ((f.lat - z.cy) * z.ky)) <= z.radius_m)
),
g AS (
    SELECT *, rn - row_number() OVER (PARTITION BY vehicle_id, zone_id ORDER BY rn) AS grp FROM zf
)
SELECT vehicle_id, zone_id, min(ts_ms) AS entry_ts_ms, max(ts_ms) AS last_inside_ts_ms,
       max(coalesce(next_ts, {never})) AS exit_or_never, count(*) AS fixes,
       first_value(lon ORDER BY rn) AS entry_lon, first_value(lat ORDER BY rn) AS entry_lat
FROM g
GROUP BY vehicle_id, zone_id, grp
ORDER BY vehicle_id, entry_ts_ms, zone_id
"""

# The fixes over their route's limit, each with the number of its run (consecutive fixes of one
# vehicle over the limit): the episodes of SPEEDING_SQL and the tracks of SPEEDING_TRACKS_SQL.
_SPEEDING_RUNS = """
WITH o AS (
    SELECT vehicle_id, route_id, speed_limit_kmh, rn, ts_ms, lon, lat, speed_kmh,
           rn - row_number() OVER (PARTITION BY vehicle_id ORDER BY rn) AS grp
    FROM enriched
    WHERE speed_limit_kmh IS NOT NULL AND speed_kmh > speed_limit_kmh
)"""

SPEEDING_SQL = (
    _SPEEDING_RUNS
    + """
SELECT vehicle_id, first_value(route_id ORDER BY rn) AS route_id,
       first_value(speed_limit_kmh ORDER BY rn) AS speed_limit_kmh,
       min(ts_ms) AS start_ts_ms, max(ts_ms) AS end_ts_ms, count(*) AS fixes, max(speed_kmh) AS max_kmh
FROM o
GROUP BY vehicle_id, grp
ORDER BY vehicle_id, start_ts_ms
"""
)

# The fixes of each speeding run (the same runs as SPEEDING_SQL), keyed by the run's first fix time.
SPEEDING_TRACKS_SQL = (
    _SPEEDING_RUNS
    + """
SELECT vehicle_id, min(ts_ms) OVER (PARTITION BY vehicle_id, grp) AS start_ts_ms, ts_ms, lon, lat,
       speed_kmh, rn
FROM o
ORDER BY vehicle_id, rn
"""
)

HEATMAP_SQL = "SELECT lat, lon FROM enriched WHERE NOT inside"

# Stops and trips (MotionParams). Each fix with: `still` (stationary), `cont_ts` (the next fix's time
# when it follows within max_gap_s, else null: the data ends or a gap ends the run), `seg` (the
# number of gap-free stretches up to it: a gap starts a new one) and `grp` (gaps and islands over
# still vs moving: constant along a run of either; with seg, a run never spans a gap). `in_stop`:
# the fix is in a run of still fixes that lasts at least min_stop_s, from its first fix to the
# first fix after it (its last one when the data ends or a gap follows). `step_m`: the metres to the
# next fix by the speeds reported at both, the trapezoid (v1 + v2) / 2 over the interval (km/h x ms /
# 7200 = m; history.reports.speed_step_m, which says why a trip's distance is not measured between
# the fixes' positions).
_MOTION_RUNS = """
WITH s AS (
    SELECT vehicle_id, rn, ts_ms, lon, lat, speed_kmh,
           (speed_kmh + lead(speed_kmh) OVER w) * (next_ts - ts_ms) / 7200.0 AS step_m,
           speed_kmh <= {stop_kmh} AS still,
           CASE WHEN next_ts - ts_ms <= {gap_ms} THEN next_ts END AS cont_ts,
           CASE WHEN ts_ms - lag(ts_ms) OVER w <= {gap_ms} THEN 0 ELSE 1 END AS new_seg
    FROM enriched
    WINDOW w AS (PARTITION BY vehicle_id ORDER BY rn)
),
g AS (
    SELECT *,
           sum(new_seg) OVER (PARTITION BY vehicle_id ORDER BY rn
                              ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS seg,
           rn - row_number() OVER (PARTITION BY vehicle_id, still ORDER BY rn) AS grp
    FROM s
),
m AS (
    SELECT *,
           min(ts_ms) OVER p AS run_start,
           max(coalesce(cont_ts, ts_ms)) OVER p AS run_end,
           still AND max(coalesce(cont_ts, ts_ms)) OVER p - min(ts_ms) OVER p >= {min_stop_ms} AS in_stop
    FROM g
    WINDOW p AS (PARTITION BY vehicle_id, seg, still, grp)
)"""

STOPS_SQL = (
    _MOTION_RUNS
    + """
SELECT vehicle_id, run_start AS start_ts_ms, max(run_end) AS end_ts_ms, count(*) AS fixes,
       first_value(lon ORDER BY rn) AS lon, first_value(lat ORDER BY rn) AS lat
FROM m
WHERE in_stop
GROUP BY vehicle_id, seg, grp, run_start
ORDER BY vehicle_id, start_ts_ms
"""
)

# The fixes in no stop, numbered by trip (islands again, within a gap-free stretch), with the
# trip's first and last fix: a fix's step to the next one counts towards the trip's distance when
# that next fix is in the same trip (it is not the trip's last).
_TRIP_FIXES = """,
t AS (
    SELECT vehicle_id, seg, rn, ts_ms, lon, lat, speed_kmh, step_m,
           rn - row_number() OVER (PARTITION BY vehicle_id ORDER BY rn) AS tgrp
    FROM m
    WHERE NOT in_stop
),
tt AS (
    SELECT *, min(ts_ms) OVER q AS trip_start, max(rn) OVER q AS last_rn, count(*) OVER q AS trip_fixes
    FROM t
    WINDOW q AS (PARTITION BY vehicle_id, seg, tgrp)
)"""

TRIPS_SQL = (
    _MOTION_RUNS
    + _TRIP_FIXES
    + """
SELECT vehicle_id, trip_start AS start_ts_ms, max(ts_ms) AS end_ts_ms, count(*) AS fixes,
       sum(CASE WHEN rn < last_rn THEN step_m ELSE 0.0 END) AS distance_m,
       max(speed_kmh) AS max_kmh,
       first_value(lon ORDER BY rn) AS start_lon, first_value(lat ORDER BY rn) AS start_lat,
       first_value(lon ORDER BY rn DESC) AS end_lon, first_value(lat ORDER BY rn DESC) AS end_lat
FROM tt
WHERE trip_fixes >= 2
GROUP BY vehicle_id, seg, tgrp, trip_start
ORDER BY vehicle_id, start_ts_ms
"""
)

# The fixes of each trip (the same trips as TRIPS_SQL), keyed by the trip's first fix time.
TRIP_TRACKS_SQL = (
    _MOTION_RUNS
    + _TRIP_FIXES
    + """
SELECT vehicle_id, trip_start AS start_ts_ms, ts_ms, lon, lat, speed_kmh, rn
FROM tt
WHERE trip_fixes >= 2
ORDER BY vehicle_id, rn
"""
)
