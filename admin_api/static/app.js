// FleetFence live operations map. Plain ES module, no build step: Leaflet and Geoman are classic
// scripts served by the admin API from web/node_modules (global `L`).
//
// Data flow: the initial state comes from /api/v1/{routes,zones,live,alerts}; afterwards the SSE
// stream (/api/v1/stream, authenticated by a short-lived token because EventSource cannot send
// X-API-Key) pushes `positions` batches and `alert`s. Vehicle states merge by seq, alerts by id, so
// the snapshot and the stream may arrive in any order.

import { api, ApiError, clearKey, getKey, listAll, setKey } from "./api.js";
import { gridLayer } from "./grid.js";

const L = window.L;
const MAX_ALERTS = 200;
const STATUS_LABEL = {
  on_route: "on route",
  deviating: "deviating",
  speeding: "speeding",
  silent: "silent",
  unassigned: "unassigned",
};
const STATUS_GLYPH = { on_route: "●", deviating: "!", speeding: "»", silent: "…", unassigned: "?" };
const ALERT_LABEL = {
  ROUTE_DEVIATION: "Route deviation",
  ROUTE_RETURN: "Back on route",
  OVERSPEED: "Speeding",
  ZONE_ENTER: "Zone entered",
  ZONE_EXIT: "Zone left",
  VEHICLE_SILENT: "Vehicle silent",
};
const ZONE_COLOUR = { depot: "#2f6f4f", restricted: "#a12b2b", customer: "#7a4fa8", other: "#56606e" };
const ROUTE_DEFAULTS = {
  corridor_width_m: 100,
  speed_limit_kmh: 50,
  deviation_min_fixes: 3,
  deviation_min_s: 0,
  overspeed_min_s: 10,
  silent_after_s: 120,
};

const $ = (id) => document.getElementById(id);

const state = {
  map: null,
  role: null,
  routes: new Map(), // id -> {feature, etag, line, corridor, item}
  zones: new Map(), // id -> {feature, layer}
  vehicles: new Map(), // id -> {state, marker, item}
  alerts: new Map(), // id -> {alert, item}
  selectedVehicle: null,
  selectedRoute: null,
  stream: null,
  streamRetryMs: 1000,
  drawing: null, // {kind: "route"|"zone", layer} while an unsaved shape is on the map
  editing: null, // {id, layer} while an existing route's geometry is being edited
};
window.fleetfence = state; // for debugging in the console (and the browser tests)

// ------------------------------------------------------------------------------------ helpers

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children) if (c !== null && c !== undefined) e.append(c);
  return e;
}

/** Click and Enter/Space activate: list items behave as buttons for keyboard users. */
function activatable(e, handler) {
  e.tabIndex = 0;
  e.setAttribute("role", "button");
  e.addEventListener("click", handler);
  e.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" || ev.key === " ") {
      ev.preventDefault();
      handler(ev);
    }
  });
  return e;
}

function say(text, kind = "info") {
  const m = $("message");
  m.textContent = text;
  m.className = `message ${kind}`;
  m.hidden = !text;
}

function fmtTime(ms) {
  return new Date(ms).toISOString().replace("T", " ").slice(0, 19) + " UTC";
}

function ago(ms) {
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (s < 90) return `${s} s ago`;
  if (s < 5400) return `${Math.round(s / 60)} min ago`;
  return `${Math.round(s / 3600)} h ago`;
}

function fmtKm(m) {
  return m >= 1000 ? `${(m / 1000).toFixed(2)} km` : `${Math.round(m)} m`;
}

function haversineM(a, b) {
  const r = 6371008.8;
  const toRad = Math.PI / 180;
  const dLat = (b[1] - a[1]) * toRad;
  const dLon = (b[0] - a[0]) * toRad;
  const h = Math.sin(dLat / 2) ** 2 + Math.cos(a[1] * toRad) * Math.cos(b[1] * toRad) * Math.sin(dLon / 2) ** 2;
  return 2 * r * Math.asin(Math.sqrt(h));
}

function lineLengthM(coords) {
  let total = 0;
  for (let i = 1; i < coords.length; i += 1) total += haversineM(coords[i - 1], coords[i]);
  return total;
}

const latlngs = (coords) => coords.map(([lon, lat]) => [lat, lon]);

/** Colour class of a live state: silent > deviating > speeding > on route > unassigned. */
export function statusOf(s) {
  if (s.silent) return "silent";
  if (s.status === "off_route") return "deviating";
  if (s.overspeed) return "speeding";
  if (s.status === "on_route") return "on_route";
  return "unassigned";
}

// ------------------------------------------------------------------------------------ map

function metresPerPixel(lat) {
  return (40075016.686 * Math.cos((lat * Math.PI) / 180)) / 2 ** (state.map.getZoom() + 8);
}

/** The corridor is drawn as a translucent line as wide, in pixels, as corridor_width_m at this zoom. */
function corridorWeight(route) {
  const bounds = route.line.getBounds();
  const px = route.feature.properties.corridor_width_m / metresPerPixel(bounds.getCenter().lat);
  return Math.max(2, Math.min(px, 4000));
}

async function initMap() {
  let config = { tile_url: null };
  try {
    config = (await api("/map/config.json")).data;
  } catch (err) {
    say(`Could not read the map configuration: ${err.message}`, "error");
  }
  const map = L.map("map", { zoomControl: true, keyboard: true, worldCopyJump: true, preferCanvas: false });
  state.map = map;
  if (config.tile_url) {
    L.tileLayer(config.tile_url, { maxZoom: 19, attribution: config.tile_attribution || "" }).addTo(map);
  } else {
    gridLayer(L).addTo(map);
  }
  map.setView([20, 0], 2);
  map.on("zoomend", () => {
    for (const r of state.routes.values()) r.corridor.setStyle({ weight: corridorWeight(r) });
  });
  map.pm.setGlobalOptions({ finishOnEnter: true, allowSelfIntersection: true });
  map.on("pm:create", onShapeDrawn);
}

// ------------------------------------------------------------------------------------ routes & zones

function addRoute(feature, etag) {
  const id = feature.id;
  removeRoute(id);
  const pts = latlngs(feature.geometry.coordinates);
  const route = { feature, etag: etag || `"${feature.properties.version}"` };
  route.corridor = L.polyline(pts, {
    color: "#3b82c4",
    opacity: 0.22,
    lineCap: "round",
    lineJoin: "round",
    interactive: false,
    className: "route-corridor",
  }).addTo(state.map);
  route.line = L.polyline(pts, { color: "#17497a", weight: 4, className: "route-line" }).addTo(state.map);
  route.line.getElement().dataset.routeId = id;
  route.corridor.setStyle({ weight: corridorWeight(route) });
  route.line.bindTooltip(`${feature.properties.name} (${id})`, { sticky: true });
  route.line.on("click", () => selectRoute(id));
  state.routes.set(id, route);
  renderRouteList();
  if (state.selectedRoute === id) renderRoutePanel();
  return route;
}

function removeRoute(id) {
  const r = state.routes.get(id);
  if (!r) return;
  r.line.remove();
  r.corridor.remove();
  state.routes.delete(id);
}

function renderRouteList() {
  const ul = $("routes");
  ul.replaceChildren();
  const ids = [...state.routes.keys()].sort();
  for (const id of ids) {
    const p = state.routes.get(id).feature.properties;
    const li = activatable(
      el(
        "li",
        { "data-route-id": id },
        el("strong", { text: p.name }),
        el("span", { class: "sub", text: ` ${id} · corridor ${p.corridor_width_m} m · ${p.speed_limit_kmh} km/h` }),
      ),
      () => selectRoute(id, true),
    );
    if (state.selectedRoute === id) li.setAttribute("aria-current", "true");
    ul.append(li);
  }
  $("route-count").textContent = `(${ids.length})`;
  renderVehiclePanel();
}

function addZone(feature) {
  const old = state.zones.get(feature.id);
  if (old) old.layer.remove();
  const p = feature.properties;
  const colour = ZONE_COLOUR[p.kind] || ZONE_COLOUR.other;
  const layer = L.geoJSON(feature, {
    style: { color: colour, weight: 2, fillOpacity: 0.12, dashArray: "6 4", className: "zone" },
  }).addTo(state.map);
  layer.bindTooltip(`${p.name} (${p.kind})`, { sticky: true });
  state.zones.set(feature.id, { feature, layer });
}

function selectRoute(id, fly = false) {
  const r = state.routes.get(id);
  if (!r) return;
  state.selectedRoute = id;
  if (fly) state.map.fitBounds(r.line.getBounds(), { padding: [40, 40], maxZoom: 16, animate: false });
  for (const [rid, other] of state.routes) other.line.setStyle({ weight: rid === id ? 6 : 4 });
  renderRoutePanel();
  renderRouteList();
}

function renderRoutePanel() {
  const box = $("route-panel");
  const r = state.routes.get(state.selectedRoute);
  $("route-section").hidden = !r;
  if (!r) return;
  const p = r.feature.properties;
  const len = lineLengthM(r.feature.geometry.coordinates);
  const rows = [
    ["Route", `${p.name} (${r.feature.id})`],
    ["Length", fmtKm(len)],
    ["Corridor", `${p.corridor_width_m} m wide`],
    ["Speed limit", `${p.speed_limit_kmh} km/h`],
    ["Deviation after", `${p.deviation_min_fixes} fixes and ${p.deviation_min_s} s`],
    ["Version", String(p.version)],
  ];
  box.replaceChildren(
    el("dl", { class: "facts" }, ...rows.flatMap(([k, v]) => [el("dt", { text: k }), el("dd", { text: v })])),
  );
  if (state.role === "admin") {
    box.append(
      el("button", { type: "button", id: "edit-route", text: "Edit route", onclick: () => startRouteEdit(r.feature.id) }),
    );
  }
}

// ------------------------------------------------------------------------------------ vehicles

function vehicleIcon(id, cls) {
  const span = el("span", { class: "veh-dot", "data-vehicle": id, "data-status": cls, text: STATUS_GLYPH[cls] });
  return L.divIcon({ className: `veh st-${cls}`, html: span, iconSize: [24, 24], iconAnchor: [12, 12] });
}

function updateVehicle(s) {
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
function scheduleVehicleList() {
  if (vehicleListTimer) return;
  vehicleListTimer = setTimeout(() => {
    vehicleListTimer = null;
    renderVehicleList();
    renderVehiclePanel();
  }, 250);
}

function renderVehicleList() {
  const ul = $("vehicles");
  const active = document.activeElement;
  const focused = active && ul.contains(active) ? active.dataset.vehicleId : null;
  ul.replaceChildren();
  const ids = [...state.vehicles.keys()].sort();
  for (const id of ids) {
    const v = state.vehicles.get(id);
    const li = activatable(
      el(
        "li",
        { "data-vehicle-id": id },
        el("span", { class: `dot st-${v.cls}`, "aria-hidden": "true", text: STATUS_GLYPH[v.cls] }),
        el("strong", { text: id }),
        el("span", { class: "sub", text: ` ${STATUS_LABEL[v.cls]} · ${Math.round(v.state.speed_kmh)} km/h` }),
      ),
      () => selectVehicle(id, true),
    );
    if (state.selectedVehicle === id) li.setAttribute("aria-current", "true");
    ul.append(li);
    if (focused === id) li.focus();
  }
  $("vehicle-count").textContent = `(${ids.length})`;
}

async function selectVehicle(id, fly = false) {
  state.selectedVehicle = id;
  const v = state.vehicles.get(id);
  for (const [vid, other] of state.vehicles) {
    const e = other.marker.getElement();
    if (e) e.classList.toggle("selected", vid === id);
  }
  if (v && fly) state.map.setView(v.marker.getLatLng(), Math.max(state.map.getZoom(), 15), { animate: false });
  renderVehicleList();
  renderVehiclePanel(true);
  $("vehicle-section").hidden = false;
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

function renderVehiclePanel(force = false) {
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
  const parts = [
    el("p", { class: "veh-head" }, el("span", { class: `dot st-${v.cls}`, "aria-hidden": "true", text: STATUS_GLYPH[v.cls] }), el("strong", { text: id })),
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
    const select = el("select", { id: "assign-route", name: "route_id" });
    for (const rid of [...state.routes.keys()].sort()) {
      select.append(el("option", { value: rid, text: rid, selected: rid === s.route_id }));
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
  box.replaceChildren(...parts);
}

async function assignVehicle(vehicleId, routeId) {
  try {
    const { data } = await api(`/api/v1/assignments/${encodeURIComponent(vehicleId)}`, {
      method: "PUT",
      body: { route_id: routeId },
    });
    say(`${vehicleId} assigned to ${data.route_id} (version ${data.version}).`, "ok");
  } catch (err) {
    say(`Could not assign ${vehicleId}: ${err.message}`, "error");
  }
}

// ------------------------------------------------------------------------------------ alerts

function addAlert(a, live) {
  if (!a || typeof a.alert_id !== "string" || state.alerts.has(a.alert_id)) return;
  const ol = $("alerts");
  const label = ALERT_LABEL[a.type] || a.type;
  const subject = a.zone_id ? ` ${a.zone_id}` : a.route_id ? ` ${a.route_id}` : "";
  const li = activatable(
    el(
      "li",
      { "data-alert-id": a.alert_id, "data-vehicle-id": a.vehicle_id, class: `alert al-${a.type}` },
      el("span", { class: "al-type", text: label }),
      el("strong", { text: ` ${a.vehicle_id}` }),
      el("span", { class: "sub", text: `${subject} · ${fmtTime(a.ts_ms)}` }),
    ),
    () => focusAlert(a.alert_id),
  );
  li.setAttribute("aria-label", `${label}, vehicle ${a.vehicle_id}, ${fmtTime(a.ts_ms)}`);
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

// ------------------------------------------------------------------------------------ live stream

function setStreamState(s, text) {
  document.body.dataset.stream = s;
  $("stream-state").textContent = text;
  $("stream-state").className = `pill ${s}`;
}

async function connectStream() {
  if (state.stream) state.stream.close();
  let token;
  try {
    token = (await api("/api/v1/stream/token", { method: "POST" })).data.token;
  } catch (err) {
    setStreamState("off", "disconnected");
    if (err instanceof ApiError && err.status === 401) return askForKey(err.message);
    setTimeout(connectStream, state.streamRetryMs);
    state.streamRetryMs = Math.min(state.streamRetryMs * 2, 30000);
    return;
  }
  const es = new EventSource(`/api/v1/stream?token=${encodeURIComponent(token)}`);
  state.stream = es;
  let opened = false;
  es.addEventListener("open", () => {
    state.streamRetryMs = 1000;
    setStreamState("live", "live");
    // Anything published while we were disconnected is caught up from the read models.
    if (opened) loadLive().catch(() => {});
    opened = true;
  });
  es.addEventListener("positions", (ev) => {
    for (const s of JSON.parse(ev.data)) updateVehicle(s);
    scheduleVehicleList();
  });
  es.addEventListener("alert", (ev) => addAlert(JSON.parse(ev.data), true));
  es.addEventListener("error", () => {
    if (es.readyState === EventSource.CLOSED) {
      // Refused (expired token, revoked key) or the server went away: ask for a new token.
      setStreamState("off", "reconnecting…");
      setTimeout(connectStream, state.streamRetryMs);
      state.streamRetryMs = Math.min(state.streamRetryMs * 2, 30000);
    } else {
      setStreamState("connecting", "reconnecting…");
    }
  });
}

async function loadLive() {
  const [live, alerts] = await Promise.all([api("/api/v1/live?limit=1000"), api("/api/v1/alerts?limit=100")]);
  for (const s of live.data.items) updateVehicle(s);
  for (const a of alerts.data.items) addAlert(a, false);
  renderVehicleList();
  renderVehiclePanel();
}

// ------------------------------------------------------------------------------------ editing

function field(name, label, value, attrs = {}) {
  const id = `f-${name}`;
  return el(
    "div",
    { class: "field" },
    el("label", { for: id, text: label }),
    el("input", { id, name, value: value ?? "", ...attrs }),
  );
}

function numberField(name, label, value, attrs = {}) {
  return field(name, label, value, { type: "number", step: "any", inputmode: "decimal", ...attrs });
}

function openEditor(title, hint, fields, onSave, onCancel) {
  $("editor-section").hidden = false;
  $("editor-title").textContent = title;
  $("editor-hint").textContent = hint;
  const form = $("editor");
  const error = el("p", { class: "error", role: "alert", id: "editor-error" });
  form.replaceChildren(
    ...fields,
    error,
    el(
      "div",
      { class: "actions" },
      el("button", { type: "submit", id: "editor-save", text: "Save" }),
      el("button", { type: "button", id: "editor-cancel", text: "Cancel", onclick: () => { closeEditor(); onCancel(); } }),
    ),
  );
  form.onsubmit = async (ev) => {
    ev.preventDefault();
    error.textContent = "";
    const values = Object.fromEntries(new FormData(form).entries());
    $("editor-save").disabled = true;
    try {
      await onSave(values);
    } catch (err) {
      error.textContent = err instanceof ApiError ? `The API refused (${err.status}): ${err.message}` : String(err);
    } finally {
      const save = $("editor-save");
      if (save) save.disabled = false;
    }
  };
  showPanel(true);
  const first = form.querySelector("input");
  if (first) first.focus();
}

function closeEditor() {
  $("editor-section").hidden = true;
  $("editor").replaceChildren();
}

function num(v) {
  return v === "" || v === undefined ? NaN : Number(v);
}

function routeProps(values) {
  return {
    name: values.name,
    corridor_width_m: num(values.corridor_width_m),
    speed_limit_kmh: num(values.speed_limit_kmh),
    deviation_min_fixes: num(values.deviation_min_fixes),
    deviation_min_s: num(values.deviation_min_s),
    overspeed_min_s: num(values.overspeed_min_s),
    silent_after_s: num(values.silent_after_s),
  };
}

function routeFields(p, withId) {
  return [
    withId ? field("id", "Route id", "", { required: true, autocomplete: "off" }) : null,
    field("name", "Name", p.name, { required: true }),
    numberField("corridor_width_m", "Corridor width (m, full width)", p.corridor_width_m, { min: "1" }),
    numberField("speed_limit_kmh", "Speed limit (km/h)", p.speed_limit_kmh, { min: "1" }),
    numberField("deviation_min_fixes", "Deviation after N fixes outside", p.deviation_min_fixes, { min: "1", step: "1" }),
    numberField("deviation_min_s", "…and at least (s)", p.deviation_min_s, { min: "0" }),
    numberField("overspeed_min_s", "Speeding alert after (s)", p.overspeed_min_s, { min: "0" }),
    numberField("silent_after_s", "Silent after (s)", p.silent_after_s, { min: "1" }),
  ].filter(Boolean);
}

function startDraw(kind) {
  if (state.role !== "admin") return;
  cancelDrawing();
  const shape = kind === "route" ? "Line" : "Polygon";
  // A quick second click on the last vertex finishes the shape; it must not also zoom the map.
  state.map.doubleClickZoom.disable();
  state.map.pm.enableDraw(shape, { snappable: true, continueDrawing: false });
  state.drawing = { kind, layer: null };
  say(
    kind === "route"
      ? "Drawing a route: click to add points; click the last point again (or press Enter) to finish; Esc cancels."
      : "Drawing a zone: click to add corners; click the first corner (or press Enter) to close it; Esc cancels.",
  );
}

function cancelDrawing() {
  state.map.pm.disableDraw();
  state.map.doubleClickZoom.enable();
  if (state.drawing && state.drawing.layer) state.drawing.layer.remove();
  state.drawing = null;
  if (state.editing) stopRouteEdit(true);
}

function onShapeDrawn(e) {
  const kind = state.drawing ? state.drawing.kind : e.shape === "Line" ? "route" : "zone";
  state.drawing = { kind, layer: e.layer };
  state.map.doubleClickZoom.enable();
  say("");
  const geometry = e.layer.toGeoJSON(6).geometry;
  if (kind === "route") {
    openEditor(
      "New route",
      `${geometry.coordinates.length} points, ${fmtKm(lineLengthM(geometry.coordinates))}.`,
      routeFields({ ...ROUTE_DEFAULTS, name: "" }, true),
      async (v) => {
        const feature = { type: "Feature", id: v.id, geometry, properties: routeProps(v) };
        const { data, etag } = await api("/api/v1/routes", { method: "POST", body: feature });
        e.layer.remove();
        state.drawing = null;
        closeEditor();
        addRoute(data, etag);
        selectRoute(data.id);
        say(`Route ${data.id} saved (version ${data.properties.version}).`, "ok");
      },
      cancelDrawing,
    );
  } else {
    const kinds = Object.keys(ZONE_COLOUR);
    const kindSelect = el("select", { id: "f-kind", name: "kind" }, ...kinds.map((k) => el("option", { value: k, text: k })));
    openEditor(
      "New zone",
      `${geometry.coordinates[0].length - 1} corners.`,
      [
        field("id", "Zone id", "", { required: true, autocomplete: "off" }),
        field("name", "Name", "", { required: true }),
        el("div", { class: "field" }, el("label", { for: "f-kind", text: "Kind" }), kindSelect),
        numberField("dwell_limit_s", "Dwell limit (s, optional)", "", { min: "1" }),
      ],
      async (v) => {
        const properties = { name: v.name, kind: v.kind };
        if (v.dwell_limit_s !== "") properties.dwell_limit_s = num(v.dwell_limit_s);
        const { data } = await api("/api/v1/zones", { method: "POST", body: { type: "Feature", id: v.id, geometry, properties } });
        e.layer.remove();
        state.drawing = null;
        closeEditor();
        addZone(data);
        say(`Zone ${data.id} saved (version ${data.properties.version}).`, "ok");
      },
      cancelDrawing,
    );
  }
}

function startRouteEdit(id) {
  const r = state.routes.get(id);
  if (!r || state.role !== "admin") return;
  cancelDrawing();
  r.line.pm.enable({ allowSelfIntersection: true, snappable: true });
  r.line.on("pm:edit", () => r.corridor.setLatLngs(r.line.getLatLngs()));
  state.editing = { id };
  openEditor(
    `Edit route ${id}`,
    "Drag the vertices on the map; change the rules here; Save sends only this version (If-Match).",
    routeFields(r.feature.properties, false),
    async (v) => {
      const geometry = r.line.toGeoJSON(6).geometry;
      const body = { type: "Feature", id, geometry, properties: routeProps(v) };
      try {
        const { data, etag } = await api(`/api/v1/routes/${encodeURIComponent(id)}`, { method: "PUT", body, ifMatch: r.etag });
        stopRouteEdit(false);
        closeEditor();
        addRoute(data, etag);
        selectRoute(id);
        say(`Route ${id} saved (version ${data.properties.version}).`, "ok");
      } catch (err) {
        if (err instanceof ApiError && err.status === 412) {
          throw new ApiError(
            412,
            `someone else changed route ${id} since you opened it (now version ${(err.etag || "?").replaceAll('"', "")}). ` +
              "Cancel, then edit the current version.",
          );
        }
        throw err;
      }
    },
    () => stopRouteEdit(true),
  );
}

async function stopRouteEdit(reload) {
  const edit = state.editing;
  state.editing = null;
  if (!edit) return;
  const r = state.routes.get(edit.id);
  if (r) r.line.pm.disable();
  if (reload) {
    try {
      const { data, etag } = await api(`/api/v1/routes/${encodeURIComponent(edit.id)}`);
      addRoute(data, etag);
    } catch (err) {
      say(`Could not reload route ${edit.id}: ${err.message}`, "error");
    }
  }
}

// ------------------------------------------------------------------------------------ start-up

function showPanel(open) {
  document.body.classList.toggle("panel-closed", !open);
  $("toggle-panel").setAttribute("aria-expanded", String(open));
  setTimeout(() => state.map && state.map.invalidateSize(), 0);
}

function askForKey(error = "") {
  const dialog = $("key-dialog");
  $("key-error").textContent = error;
  $("key-input").value = "";
  if (!dialog.open) dialog.showModal();
  $("key-input").focus();
}

async function start() {
  let token;
  try {
    token = (await api("/api/v1/stream/token", { method: "POST" })).data;
  } catch (err) {
    clearKey();
    return askForKey(err instanceof ApiError && err.status === 401 ? "That key was refused: " + err.message : err.message);
  }
  state.role = token.role;
  document.body.dataset.role = token.role;
  connectStream();
  try {
    const [routes, zones] = await Promise.all([listAll("/api/v1/routes", "features"), listAll("/api/v1/zones", "features")]);
    for (const f of zones) addZone(f);
    for (const f of routes) addRoute(f);
    await loadLive();
  } catch (err) {
    say(`Loading failed: ${err.message}`, "error");
    return;
  }
  const bounds = L.latLngBounds([]);
  for (const r of state.routes.values()) bounds.extend(r.line.getBounds());
  for (const v of state.vehicles.values()) bounds.extend(v.marker.getLatLng());
  if (bounds.isValid()) state.map.fitBounds(bounds, { padding: [30, 30], maxZoom: 15, animate: false });
  document.body.dataset.loaded = "true";
}

function wire() {
  $("key-form").addEventListener("submit", (ev) => {
    const key = $("key-input").value.trim();
    if (!key) {
      ev.preventDefault();
      return;
    }
    setKey(key);
    start();
  });
  $("key-dialog").addEventListener("cancel", (ev) => {
    if (!getKey()) ev.preventDefault(); // nothing works without a key
  });
  $("change-key").addEventListener("click", () => askForKey());
  $("draw-route").addEventListener("click", () => startDraw("route"));
  $("draw-zone").addEventListener("click", () => startDraw("zone"));
  $("toggle-panel").addEventListener("click", () => showPanel(document.body.classList.contains("panel-closed")));
  document.addEventListener("keydown", (ev) => {
    if (ev.key === "Escape" && (state.drawing || state.editing) && !$("key-dialog").open) {
      cancelDrawing();
      closeEditor();
      say("Drawing cancelled.");
    }
  });
  setInterval(() => state.selectedVehicle && renderVehiclePanel(), 5000);
  if (window.matchMedia("(max-width: 900px)").matches) showPanel(false);
}

async function main() {
  wire();
  await initMap();
  if (getKey()) start();
  else askForKey();
}

main();
