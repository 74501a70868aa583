"""History: the columnar archive of telemetry, alerts and master data, reports over it, and
restatement (re-running the live geofence logic over the archive). See docs/history.md."""
