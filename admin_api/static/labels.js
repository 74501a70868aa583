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
// Each alert type's words, colour family and list detail, as fleetfence.contracts.AlertType declares
// it (its AlertMeta), read once from the API (/map/alert-types.json, served without a key): a new
// type needs nothing here. If it cannot be read, a type shows as its name, in plain text.
const ALERT_TYPES = await fetch("/map/alert-types.json")
  .then((res) => (res.ok ? res.json() : {}))
  .catch(() => ({}));
const byType = (pick) => Object.fromEntries(Object.entries(ALERT_TYPES).map(([t, meta]) => [t, pick(meta)]));
export const ALERT_LABEL = byType((meta) => meta.label);
// The colour family (app.css `.tone-*`) of each alert type in the alert list, and of the vehicle
// panel's trip badges: a trouble that opens has its own colour, the alert that ends one is the
// same calm green whichever it ends; zone entries and exits are plain text.
export const ALERT_TONE = byType((meta) => meta.tone);
// The facts of `details` the alert list shows: [template, field, format] (alerts.js alertDetail).
export const ALERT_DETAIL = byType((meta) => meta.detail);

export function alertTone(type) {
  return ALERT_TONE[type] || "plain";
}
