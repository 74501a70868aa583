// The alert list: newest first by event time, live alerts highlighted for a moment, at most
// MAX_ALERTS kept. Activating an alert centres the map on where it happened, rings that spot and
// opens the vehicle's panel.

import { state } from "./state.js";
import { $, activatable, el, fmtDelay, fmtDuration, fmtKm, fmtTime } from "./dom.js";
import { ALERT_DETAIL, ALERT_LABEL, alertTone } from "./labels.js";
import { selectVehicle } from "./vehicles.js";

const L = window.L;
const MAX_ALERTS = 200;

const num = (v) => typeof v === "number" && Number.isFinite(v);

const FORMAT = { km: fmtKm, duration: fmtDuration, delay: fmtDelay, number: (v) => `${Math.round(v * 10) / 10}` };

/** The facts of an alert's `details` an operator wants in the list, as its type declares them
 * (labels.js ALERT_DETAIL): how far back, how long stopped, how late, how it ended; "" for types
 * with none, or details an older processor did not send. */
export function alertDetail(a) {
  const d = a.details || {};
  return (ALERT_DETAIL[a.type] || [])
    .filter(([, field]) => num(d[field]))
    .map(([template, field, format]) => template.replace("{}", FORMAT[format](d[field])))
    .join(", ");
}

export function addAlert(a, live) {
  if (!a || typeof a.alert_id !== "string" || state.alerts.has(a.alert_id)) return;
  const ol = $("alerts");
  const label = ALERT_LABEL[a.type] || a.type;
  const tone = alertTone(a.type);
  const subject = a.zone_id ? ` ${a.zone_id}` : a.route_id ? ` ${a.route_id}` : "";
  const detail = alertDetail(a);
  const li = activatable(
    el(
      "li",
      { "data-alert-id": a.alert_id, "data-vehicle-id": a.vehicle_id, "data-tone": tone, class: `alert al-${a.type} tone-${tone}` },
      el("span", { class: "al-type", text: label }),
      el("strong", { text: ` ${a.vehicle_id}` }),
      el("span", { class: "sub", text: `${subject}${detail ? ` · ${detail}` : ""} · ${fmtTime(a.ts_ms)}` }),
    ),
    () => focusAlert(a.alert_id),
  );
  li.setAttribute("aria-label", `${label}, vehicle ${a.vehicle_id}${detail ? `, ${detail}` : ""}, ${fmtTime(a.ts_ms)}`);
  // Newest first by event time; a live alert is normally the newest, a replayed one slots in.
  let before = null;
  for (const child of ol.children) {
    const other = state.alerts.get(child.dataset.alertId);
    if (other && other.alert.ts_ms <= a.ts_ms) {
      before = child;
      break;
    }
  }
  ol.insertBefore(li, before);
  if (live) {
    li.classList.add("fresh");
    setTimeout(() => li.classList.remove("fresh"), 4000);
  }
  state.alerts.set(a.alert_id, { alert: a, item: li });
  while (ol.children.length > MAX_ALERTS) {
    const last = ol.lastElementChild;
    state.alerts.delete(last.dataset.alertId);
    last.remove();
  }
  $("alert-count").textContent = `(${ol.children.length})`;
}

let alertMarker = null;
function focusAlert(alertId) {
  const entry = state.alerts.get(alertId);
  if (!entry) return;
  const a = entry.alert;
  for (const li of $("alerts").children) li.toggleAttribute("aria-current", li.dataset.alertId === alertId);
  if (typeof a.lat === "number" && typeof a.lon === "number") {
    // No animation: Leaflet drops a setView issued while a zoom animation runs, so a quick second
    // click would otherwise leave the map on the first alert.
    state.map.setView([a.lat, a.lon], Math.max(state.map.getZoom(), 15), { animate: false });
    if (alertMarker) alertMarker.remove();
    alertMarker = L.circleMarker([a.lat, a.lon], { radius: 14, color: "#b00020", weight: 3, fill: false, className: "alert-ring" }).addTo(state.map);
  }
  selectVehicle(a.vehicle_id, false);
}
