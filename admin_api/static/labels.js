// The words and glyphs the page shows for the API's codes (vehicle status classes, alert types).
// Shared by the vehicle panel and the alert list, which is why they live in neither.

export const STATUS_LABEL = {
  on_route: "on route",
  deviating: "deviating",
  speeding: "speeding",
  silent: "silent",
  unassigned: "unassigned",
};
export const STATUS_GLYPH = { on_route: "●", deviating: "!", speeding: "»", silent: "…", unassigned: "?" };
export const ALERT_LABEL = {
  ROUTE_DEVIATION: "Route deviation",
  ROUTE_RETURN: "Back on route",
  OVERSPEED: "Speeding",
  ZONE_ENTER: "Zone entered",
  ZONE_EXIT: "Zone left",
  VEHICLE_SILENT: "Vehicle silent",
  VEHICLE_RESUMED: "Vehicle back",
  // The trip along the route (issue #26).
  WRONG_DIRECTION: "Wrong direction",
  DIRECTION_RESTORED: "Direction restored",
  UNPLANNED_STOP: "Unplanned stop",
  STOP_ENDED: "Stop ended",
  ARRIVAL_AT_RISK: "Arrival at risk",
  ARRIVAL_BACK_ON_TIME: "Back on time",
  ROUTE_COMPLETED: "Route completed",
};
// The colour family (app.css `.tone-*`) of each alert type in the alert list, and of the vehicle
// panel's trip badges. A trouble that opens has its own colour (wrong way red, a stop magenta, a late
// arrival amber); the alert that ends one is the same calm green whichever it ends, so the list reads
// at a glance as "new trouble" or "resolved"; a completed trip is the stronger green. Types not
// listed (zone entries and exits) are plain text.
export const ALERT_TONE = {
  ROUTE_DEVIATION: "deviating",
  ROUTE_RETURN: "calm",
  OVERSPEED: "speeding",
  VEHICLE_SILENT: "silent",
  VEHICLE_RESUMED: "calm",
  WRONG_DIRECTION: "wrong-way",
  DIRECTION_RESTORED: "calm",
  UNPLANNED_STOP: "stop",
  STOP_ENDED: "calm",
  ARRIVAL_AT_RISK: "risk",
  ARRIVAL_BACK_ON_TIME: "calm",
  ROUTE_COMPLETED: "done",
};

export function alertTone(type) {
  return ALERT_TONE[type] || "plain";
}
