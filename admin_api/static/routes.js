// Routes on the map and in the side panel: each route's line and corridor band, the route list and
// the selected route's facts. Editing a route belongs to editor.js (which imports this module), so
// the "Edit route" button and the follow-up of a list change reach out through hooks app.js sets.

import { state } from "./state.js";
import { $, activatable, el, fmtKm } from "./dom.js";
import { corridorWeight, latlngs, lineLengthM } from "./geo.js";

const L = window.L;

const hooks = {
  listChanged: () => {}, // the route list was redrawn (the vehicle panel shows route names)
  edit: () => {}, // the admin asked to edit route `id`
};

/** app.js: what follows a change of the route list, and who edits a route. */
export function wireRoutes({ listChanged, edit }) {
  hooks.listChanged = listChanged;
  hooks.edit = edit;
}

export function addRoute(feature, etag) {
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
  route.corridor.setStyle({ weight: corridorWeight(route, state.map.getZoom()) });
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

/** After a zoom: every corridor band keeps its width in metres. */
export function restyleCorridors() {
  const zoom = state.map.getZoom();
  for (const r of state.routes.values()) r.corridor.setStyle({ weight: corridorWeight(r, zoom) });
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
  hooks.listChanged();
}

export function selectRoute(id, fly = false) {
  const r = state.routes.get(id);
  if (!r) return;
  state.selectedRoute = id;
  if (fly) state.map.fitBounds(r.line.getBounds(), { padding: [40, 40], maxZoom: 16, animate: false });
  for (const [rid, other] of state.routes) other.line.setStyle({ weight: rid === id ? 6 : 4 });
  renderRoutePanel();
  renderRouteList();
}

const given = (v) => v !== undefined;

/** The route's trip rules (issue #26) as [label, text] rows; a rule set to null is off. A route
 * stored before these rules existed has none of the fields: nothing is shown for them rather than
 * a guess (the processor applies the defaults, which the edit form offers). */
export function tripRuleFacts(p) {
  const rows = [];
  if (given(p.wrong_way_min_m)) {
    rows.push([
      "Wrong way after",
      p.wrong_way_min_m === null ? "off" : `${p.wrong_way_min_m} m back, over ${p.wrong_way_min_fixes} fixes and ${p.wrong_way_min_s} s`,
    ]);
  }
  if (given(p.stop_min_s)) {
    rows.push([
      "Unplanned stop after",
      p.stop_min_s === null ? "off" : `${p.stop_min_s} s at ≤ ${p.stop_speed_kmh} km/h within ${p.stop_radius_m} m`,
    ]);
  }
  if (given(p.arrival_risk_s)) {
    rows.push(["Arrival at risk", p.arrival_risk_s === null ? "off" : `ETA > ${p.arrival_risk_s} s after the plan`]);
  }
  if (given(p.planned_duration_s) && p.planned_duration_s !== null) rows.push(["Planned trip time", `${p.planned_duration_s} s`]);
  if (given(p.completion_radius_m)) rows.push(["Completed within", `${p.completion_radius_m} m of the end`]);
  return rows;
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
    ...tripRuleFacts(p),
    ["Version", String(p.version)],
  ];
  box.replaceChildren(
    el("dl", { class: "facts" }, ...rows.flatMap(([k, v]) => [el("dt", { text: k }), el("dd", { text: v })])),
  );
  if (state.role === "admin") {
    box.append(
      el("button", { type: "button", id: "edit-route", text: "Edit route", onclick: () => hooks.edit(r.feature.id) }),
    );
  }
}
