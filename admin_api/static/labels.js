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
};
