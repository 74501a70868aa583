// FleetFence live operations map: the entry module that builds the map and wires the panels
// together. Plain ES modules, no build step: Leaflet and Geoman are classic scripts served by the
// admin API from web/node_modules (global `L`).
//
// Data flow: the initial state comes from /api/v1/{routes,zones,live,alerts}; afterwards the SSE
// stream (/api/v1/stream, authenticated by a short-lived token because EventSource cannot send
// X-API-Key) pushes `positions` batches and `alert`s. Vehicle states merge by seq, alerts by id, so
// the snapshot and the stream may arrive in any order.
//
// Modules: state.js (shared state), dom.js (DOM/text helpers), geo.js (geometry), labels.js (status
// and alert words), routes.js, zones.js, vehicles.js, alerts.js (map layers and panels), stream.js
// (live feed), editor.js (drawing and forms), schema.js (route defaults, zone kinds: /openapi.json),
// auth.js (key dialog), api.js (fetch + key), grid.js (offline base layer).

import { api, ApiError, clearKey, getKey, listAll, setKey } from "./api.js";
import { askForKey } from "./auth.js";
import { $, say, showPanel } from "./dom.js";
import { cancelDrawing, closeEditor, onShapeDrawn, startDraw, startRouteEdit, startZoneEdit } from "./editor.js";
import { gridLayer } from "./grid.js";
import { addRoute, restyleCorridors, wireRoutes } from "./routes.js";
import { routeDefaults } from "./schema.js";
import { state } from "./state.js";
import { connectStream, loadLive } from "./stream.js";
import { renderVehiclePanel } from "./vehicles.js";
import { addZone } from "./zones.js";

const L = window.L;

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
  map.on("zoomend", restyleCorridors);
  map.pm.setGlobalOptions({ finishOnEnter: true, allowSelfIntersection: true });
  map.on("pm:create", onShapeDrawn);
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
  // The vehicle panel shows route names and the assign list; editor.js edits routes.
  wireRoutes({ listChanged: () => renderVehiclePanel(), edit: startRouteEdit });
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
  $("draw-circle").addEventListener("click", () => startDraw("circle"));
  state.zoneClick = (id) => startZoneEdit(id);
  $("toggle-panel").addEventListener("click", () => showPanel(document.body.classList.contains("panel-closed")));
  document.addEventListener("keydown", (ev) => {
    if (ev.key === "Escape" && (state.drawing || state.editing || state.zoneEditing) && !$("key-dialog").open) {
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
  routeDefaults(); // once, at start-up: the new-route form needs them (no key required)
  await initMap();
  if (getKey()) start();
  else askForKey();
}

main();
