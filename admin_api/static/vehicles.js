// Vehicles: one marker per vehicle moved by its live state (merged by seq, so a late older state
// never moves it back), the vehicle list, the selected vehicle's panel with route progress, and
// assigning a vehicle to a route (with the API's warnings about what the assignment leaves
// uncovered). Fed by stream.js; alerts.js selects a vehicle through here. The panel's MQTT
// credentials part is credentials.js's, read afresh at each selection.

import { api, ApiError, warningsOf } from "./api.js";
import { showCredentials } from "./credentials.js";
import { state } from "./state.js";
import { $, activatable, ago, el, fmtDelay, fmtDuration, fmtKm, fmtTime, say } from "./dom.js";
import { lineLengthM } from "./geo.js";
import { ALERT_LABEL, STATUS_GLYPH, STATUS_LABEL } from "./labels.js";

const L = window.L;

/** Colour class of a live state: silent > deviating > speeding > on route > unassigned. */
export function statusOf(s) {
  if (s.silent) return "silent";
  if (s.status === "off_route") return "deviating";
  if (s.overspeed) return "speeding";
  if (s.status === "on_route") return "on_route";
  return "unassigned";
}

/** Fixes the processor received from the vehicle with no assignment valid at their event time (no
 * route alerts for them); 0 when the state does not say (written by an older processor). */
export function unassignedFixes(s) {
  const n = s.unassigned_fixes;
  return Number.isInteger(n) && n > 0 ? n : 0;
}

const UNASSIGNED_FIXES_HINT = "no assignment valid at their time (check the assignment's valid from)";

function fixesText(n) {
  return `${n} unassigned ${n === 1 ? "fix" : "fixes"}`;
}

const isNum = (v) => typeof v === "number" && Number.isFinite(v);

/** The trip along the route (issue #26) as facts for the panel: [label, text] rows for the stop,
 * the ETA against the plan and the distance driven off the corridor. Only what the state tells: a
 * state from an older processor (no trip fields) or a vehicle without a route has none. */
export function tripFacts(s) {
  const rows = [];
  if (s.stop && isNum(s.stopped_since_ms)) {
    // How long by the last fix (event time), not by this browser's clock.
    const long = isNum(s.ts_ms) ? `${fmtDuration((s.ts_ms - s.stopped_since_ms) / 1000)}, ` : "";
    rows.push(["Stopped", `since ${fmtTime(s.stopped_since_ms)} (${long}${s.stop})`]);
  }
  if (isNum(s.eta_ms)) rows.push(["ETA", fmtTime(s.eta_ms)]);
  if (isNum(s.planned_arrival_ms)) rows.push(["Planned arrival", fmtTime(s.planned_arrival_ms)]);
  if (isNum(s.delay_s)) rows.push(["Delay vs plan", fmtDelay(s.delay_s)]);
  if (isNum(s.off_route_m) && s.off_route_m > 0) rows.push(["Off corridor", `${fmtKm(s.off_route_m)} this trip`]);
  return rows;
}

/** The trip's open troubles and its end as badges ({trip, text, tone}; tone as in labels.js
 * ALERT_TONE): wrong way, an unplanned stop (with its start), arrival at risk, completed. */
export function tripBadges(s) {
  const out = [];
  if (s.wrong_way === true) out.push({ trip: "wrong-way", text: "Wrong way", tone: "wrong-way" });
  if (s.stop === "unplanned") {
    const since = isNum(s.stopped_since_ms) ? ` since ${fmtTime(s.stopped_since_ms)}` : "";
    out.push({ trip: "unplanned-stop", text: `Unplanned stop${since}`, tone: "stop" });
  }
  if (s.arrival_at_risk === true) {
    const late = isNum(s.delay_s) ? `: ${fmtDelay(s.delay_s)}` : "";
    out.push({ trip: "arrival-at-risk", text: `Arrival at risk${late}`, tone: "risk" });
  }
  if (s.completed === true) out.push({ trip: "completed", text: "Route completed", tone: "done" });
  return out;
}

function vehicleIcon(id, cls) {
  const span = el("span", { class: "veh-dot", "data-vehicle": id, "data-status": cls, text: STATUS_GLYPH[cls] });
  return L.divIcon({ className: `veh st-${cls}`, html: span, iconSize: [24, 24], iconAnchor: [12, 12] });
}

export function updateVehicle(s) {
  if (!s || typeof s.vehicle_id !== "string" || typeof s.lat !== "number") return;
  const id = s.vehicle_id;
  let v = state.vehicles.get(id);
  if (v && v.state.seq > s.seq) return; // an older state arriving late
  if (v && v.state.seq === s.seq && v.state.silent && !s.silent) return;
  const cls = statusOf(s);
  if (!v) {
    const marker = L.marker([s.lat, s.lon], {
      icon: vehicleIcon(id, cls),
      keyboard: true,
      title: id,
      riseOnHover: true,
    }).addTo(state.map);
    marker.on("click", () => selectVehicle(id));
    // A div icon has no alt text: name the marker and its status for screen readers.
    const icon = marker.getElement();
    icon.setAttribute("role", "button");
    icon.setAttribute("aria-label", `${id}: ${STATUS_LABEL[cls]}`);
    v = { state: s, marker, cls };
    state.vehicles.set(id, v);
  } else {
    v.marker.setLatLng([s.lat, s.lon]);
    if (v.cls !== cls) {
      const e = v.marker.getElement();
      if (e) {
        e.className = e.className.replace(/\bst-\S+/, `st-${cls}`);
        const dot = e.querySelector(".veh-dot");
        dot.dataset.status = cls;
        dot.textContent = STATUS_GLYPH[cls];
        e.setAttribute("aria-label", `${id}: ${STATUS_LABEL[cls]}`);
      }
      v.cls = cls;
    }
    v.state = { ...v.state, ...s };
  }
  v.marker.setZIndexOffset(cls === "on_route" || cls === "unassigned" ? 0 : 500);
}

let vehicleListTimer = null;
export function scheduleVehicleList() {
  if (vehicleListTimer) return;
  vehicleListTimer = setTimeout(() => {
    vehicleListTimer = null;
    renderVehicleList();
    renderVehiclePanel();
  }, 250);
}

export function renderVehicleList() {
  const ul = $("vehicles");
  const active = document.activeElement;
  const focused = active && ul.contains(active) ? active.dataset.vehicleId : null;
  ul.replaceChildren();
  const ids = [...state.vehicles.keys()].sort();
  for (const id of ids) {
    const v = state.vehicles.get(id);
    // A vehicle sending telemetry that no assignment covers stands out: its fixes get no route alerts.
    const unassigned = v.state.status === "unassigned" ? unassignedFixes(v.state) : 0;
    const li = activatable(
      el(
        "li",
        { "data-vehicle-id": id, "data-unassigned-fixes": unassigned || null },
        el("span", { class: `dot st-${v.cls}`, "aria-hidden": "true", text: STATUS_GLYPH[v.cls] }),
        el("strong", { text: id }),
        el("span", { class: "sub", text: ` ${STATUS_LABEL[v.cls]} · ${Math.round(v.state.speed_kmh)} km/h` }),
        unassigned
          ? el("span", { class: "badge warn", title: `${fixesText(unassigned)}: ${UNASSIGNED_FIXES_HINT}`, text: fixesText(unassigned) })
          : null,
      ),
      () => selectVehicle(id, true),
    );
    if (state.selectedVehicle === id) li.setAttribute("aria-current", "true");
    ul.append(li);
    if (focused === id) li.focus();
  }
  $("vehicle-count").textContent = `(${ids.length})`;
}

export async function selectVehicle(id, fly = false) {
  state.selectedVehicle = id;
  const v = state.vehicles.get(id);
  for (const [vid, other] of state.vehicles) {
    const e = other.marker.getElement();
    if (e) e.classList.toggle("selected", vid === id);
  }
  if (v && fly) state.map.setView(v.marker.getLatLng(), Math.max(state.map.getZoom(), 15), { animate: false });
  renderVehicleList();
  renderVehiclePanel(true);
  showCredentials(id);
  $("vehicle-section").hidden = false;
  showHeard(id);
  try {
    const { data } = await api(`/api/v1/live/${encodeURIComponent(id)}`);
    updateVehicle(data);
    if (state.selectedVehicle === id) {
      state.vehicles.get(id).openAlerts = data.open_alerts || [];
      renderVehiclePanel(true);
    }
  } catch (err) {
    if (!(err instanceof ApiError && err.status === 404)) say(`Vehicle ${id}: ${err.message}`, "error");
  }
}

const PROTOCOL_LABEL = {
  mqtt: "MQTT (FleetFence JSON)",
  teltonika: "Teltonika",
  osmand: "Traccar Client (OsmAnd)",
  owntracks: "OwnTracks",
};

// Which tracker the device edge last heard the vehicle through (GET .../vehicles/{id}/heard):
// read at each selection, kept on the vehicle for the panel's redraws.
async function showHeard(id) {
  try {
    const { data } = await api(`/api/v1/vehicles/${encodeURIComponent(id)}/heard`);
    const v = state.vehicles.get(id);
    if (v && data.protocol) {
      v.heard = data;
      if (state.selectedVehicle === id) renderVehiclePanel(true);
    }
  } catch (err) {
    say(`Vehicle ${id}: ${err.message}`, "error");
  }
}

export function heardText(h) {
  const via = PROTOCOL_LABEL[h.protocol] || h.protocol;
  return `${via}, ${fmtTime(Date.parse(h.heard_at))} (${h.replica})`;
}

export function renderVehiclePanel(force = false) {
  const id = state.selectedVehicle;
  const box = $("vehicle-panel");
  // Live updates must not yank focus or a half-made choice from under a keyboard user.
  if (!id || (!force && box.contains(document.activeElement))) return;
  const v = state.vehicles.get(id);
  if (!v) {
    box.replaceChildren(el("p", { text: `No live state for ${id} yet.` }));
    return;
  }
  const s = v.state;
  // A forced redraw (the vehicle's fresh state arriving just after a click on it) keeps the route
  // an admin already picked for this vehicle, and the focus on that choice, instead of resetting both.
  const prev = box.querySelector("#assign-route");
  const refocus = prev !== null && prev === document.activeElement;
  const route = s.route_id ? state.routes.get(s.route_id) : null;
  const routeLen = route ? lineLengthM(route.feature.geometry.coordinates) : null;
  const ratio = s.route_id && typeof s.progress_ratio === "number" ? Math.min(1, Math.max(0, s.progress_ratio)) : null;
  const rows = [
    ["Status", STATUS_LABEL[v.cls]],
    ["Speed", `${s.speed_kmh.toFixed(0)} km/h${route ? ` (limit ${route.feature.properties.speed_limit_kmh})` : ""}`],
    ["Route", s.route_id ? `${route ? route.feature.properties.name : s.route_id} (${s.route_id})` : "none"],
    ["Last fix", `${fmtTime(s.ts_ms)}, ${ago(s.ts_ms)}`],
    ["Zones", s.zones && s.zones.length ? s.zones.join(", ") : "none"],
  ];
  if (v.heard) rows.push(["Heard via", heardText(v.heard)]);
  if (s.route_id) rows.push(...tripFacts(s));
  const unassigned = unassignedFixes(s);
  if (unassigned) rows.push(["Unassigned fixes", `${unassigned} — ${UNASSIGNED_FIXES_HINT}`]);
  const badges = s.route_id ? tripBadges(s) : [];
  const parts = [
    el("p", { class: "veh-head" }, el("span", { class: `dot st-${v.cls}`, "aria-hidden": "true", text: STATUS_GLYPH[v.cls] }), el("strong", { text: id })),
    badges.length
      ? el(
          "p",
          { class: "trip-badges" },
          ...badges.map((b) => el("span", { class: `badge tone-${b.tone}`, "data-trip": b.trip, text: b.text })),
        )
      : null,
    el("dl", { class: "facts" }, ...rows.flatMap(([k, val]) => [el("dt", { text: k }), el("dd", { text: val })])),
  ];
  if (ratio !== null) {
    const pct = Math.round(ratio * 100);
    const done = typeof s.progress_m === "number" ? fmtKm(s.progress_m) : "";
    parts.push(
      el("label", { for: "route-progress", text: `Route progress: ${pct} %${done ? ` (${done}${routeLen ? ` of ${fmtKm(routeLen)}` : ""})` : ""}` }),
      el("progress", { id: "route-progress", max: "100", value: String(pct) }),
    );
  }
  if (v.openAlerts && v.openAlerts.length) {
    parts.push(el("p", { class: "sub", text: `Open: ${v.openAlerts.map((a) => ALERT_LABEL[a.type] || a.type).join(", ")}` }));
  }
  if (state.role === "admin" && state.routes.size) {
    const picked = prev && prev.dataset.vehicleId === id && prev.dataset.picked ? prev.value : null;
    const select = el("select", { id: "assign-route", name: "route_id", "data-vehicle-id": id, "data-picked": picked !== null ? "true" : null });
    select.addEventListener("change", () => (select.dataset.picked = "true"));
    for (const rid of [...state.routes.keys()].sort()) {
      select.append(el("option", { value: rid, text: rid, selected: rid === (picked ?? s.route_id) }));
    }
    parts.push(
      el(
        "form",
        { class: "assign", id: "assign-form", onsubmit: (ev) => { ev.preventDefault(); assignVehicle(id, select.value); } },
        el("label", { for: "assign-route", text: "Assign to route" }),
        select,
        el("button", { type: "submit", text: "Assign" }),
      ),
    );
  }
  box.replaceChildren(...parts.filter(Boolean));
  if (refocus && $("assign-route")) $("assign-route").focus();
}

async function assignVehicle(vehicleId, routeId) {
  try {
    const { data } = await api(`/api/v1/assignments/${encodeURIComponent(vehicleId)}`, {
      method: "PUT",
      body: { route_id: routeId },
    });
    const done = `${vehicleId} assigned to ${data.route_id} (version ${data.version}).`;
    // Saved, but the API says what it will not cover (e.g. telemetry sent before valid_from).
    const warnings = warningsOf(data);
    if (warnings.length) say([done, ...warnings.map((w) => `Warning: ${w}`)].join("\n"), "warn");
    else say(done, "ok");
  } catch (err) {
    say(`Could not assign ${vehicleId}: ${err.message}`, "error");
  }
}
