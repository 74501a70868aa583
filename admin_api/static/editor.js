// Drawing and editing in the side panel's form (admin keys): draw a new route or zone with Geoman,
// edit an existing route's vertices and rules, and save through the API with its own validation
// messages and If-Match conflicts shown next to the form.

import { api, ApiError } from "./api.js";
import { state } from "./state.js";
import { $, el, fmtKm, say, showPanel } from "./dom.js";
import { lineLengthM } from "./geo.js";
import { addRoute, selectRoute } from "./routes.js";
import { routeDefaults, zoneSchema } from "./schema.js";
import { addZone, ZONE_COLOUR } from "./zones.js";

// What the new-route form suggests for the two rules the API requires: the model has no default
// for them (every route chooses its own), so these are the page's suggestion, not a server value.
// The other rules' defaults come from the server (schema.js).
const REQUIRED_RULE_SUGGESTIONS = { corridor_width_m: 100, speed_limit_kmh: 50 };

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

export function closeEditor() {
  $("editor-section").hidden = true;
  $("editor").replaceChildren();
}

function num(v) {
  return v === "" || v === undefined ? NaN : Number(v);
}

/** An input that may be left empty: null then, which switches a rule off where the model allows
 * null, and is refused by the API (with its own message) where it does not. */
function numOrNull(v) {
  return v === "" || v === undefined ? null : Number(v);
}

// The trip rules (issue #26) every route carries. The form sends all of them on every save: a PUT
// replaces the whole route, so a rule the form left out would silently fall back to its default.
const TRIP_RULES = [
  "wrong_way_min_m",
  "wrong_way_min_fixes",
  "wrong_way_min_s",
  "stop_min_s",
  "stop_speed_kmh",
  "stop_radius_m",
  "arrival_risk_s",
  "planned_duration_s",
  "completion_radius_m",
];

function routeProps(values) {
  const props = {
    name: values.name,
    corridor_width_m: num(values.corridor_width_m),
    speed_limit_kmh: num(values.speed_limit_kmh),
    deviation_min_fixes: num(values.deviation_min_fixes),
    deviation_min_s: num(values.deviation_min_s),
    overspeed_min_s: num(values.overspeed_min_s),
    silent_after_s: num(values.silent_after_s),
  };
  for (const name of TRIP_RULES) props[name] = numOrNull(values[name]);
  return props;
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
    el(
      "fieldset",
      { class: "rules", id: "trip-rules" },
      el("legend", { text: "Trip: direction, stops, arrival" }),
      numberField("wrong_way_min_m", "Wrong way after going back (m, empty: off)", p.wrong_way_min_m, { min: "0" }),
      numberField("wrong_way_min_fixes", "Wrong way over at least N fixes", p.wrong_way_min_fixes, { min: "1", step: "1" }),
      numberField("wrong_way_min_s", "Wrong way over at least (s)", p.wrong_way_min_s, { min: "0" }),
      numberField("stop_min_s", "Unplanned stop after (s, empty: off)", p.stop_min_s, { min: "1" }),
      numberField("stop_speed_kmh", "Stopped below (km/h)", p.stop_speed_kmh, { min: "0" }),
      numberField("stop_radius_m", "Stopped within (m)", p.stop_radius_m, { min: "1" }),
      numberField("arrival_risk_s", "Arrival at risk when late by (s, empty: off)", p.arrival_risk_s, { min: "0" }),
      numberField("planned_duration_s", "Planned trip time (s, optional)", p.planned_duration_s, { min: "1" }),
      numberField("completion_radius_m", "Completed within (m of the end)", p.completion_radius_m, { min: "1" }),
    ),
  ].filter(Boolean);
}

/** The zone form's kind and planned-stop choices, from the API's schema when it could be read
 * (else the kinds this page has colours for, and no explanation). */
async function zoneChoices() {
  const schema = await zoneSchema();
  const kinds = schema ? schema.kinds : Object.keys(ZONE_COLOUR);
  const chosen = schema && kinds.includes(schema.defaultKind) ? schema.defaultKind : kinds[0];
  const kindSelect = el(
    "select",
    { id: "f-kind", name: "kind" },
    ...kinds.map((k) => el("option", { value: k, text: k.replaceAll("_", " "), selected: k === chosen })),
  );
  const help = schema && schema.plannedStopHelp;
  const stopSelect = el(
    "select",
    { id: "f-planned_stop", name: "planned_stop", "aria-describedby": help ? "f-planned_stop-help" : null },
    el("option", { value: "", text: "by kind" }),
    el("option", { value: "true", text: "yes" }),
    el("option", { value: "false", text: "no" }),
  );
  return [
    el("div", { class: "field" }, el("label", { for: "f-kind", text: "Kind" }), kindSelect),
    el(
      "div",
      { class: "field" },
      el("label", { for: "f-planned_stop", text: "Planned stop" }),
      stopSelect,
      help ? el("p", { class: "hint", id: "f-planned_stop-help", text: help }) : null,
    ),
  ];
}

export function startDraw(kind) {
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

export function cancelDrawing() {
  state.map.pm.disableDraw();
  state.map.doubleClickZoom.enable();
  if (state.drawing && state.drawing.layer) state.drawing.layer.remove();
  state.drawing = null;
  if (state.editing) stopRouteEdit(true);
}

export async function onShapeDrawn(e) {
  const kind = state.drawing ? state.drawing.kind : e.shape === "Line" ? "route" : "zone";
  state.drawing = { kind, layer: e.layer };
  state.map.doubleClickZoom.enable();
  say("");
  const geometry = e.layer.toGeoJSON(6).geometry;
  if (kind === "route") {
    const defaults = await routeDefaults(); // read at start-up; normally already there
    if (!state.drawing || state.drawing.layer !== e.layer) return; // cancelled meanwhile
    openEditor(
      "New route",
      `${geometry.coordinates.length} points, ${fmtKm(lineLengthM(geometry.coordinates))}.`,
      routeFields({ ...REQUIRED_RULE_SUGGESTIONS, ...defaults, name: "" }, true),
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
    const choices = await zoneChoices(); // the schema was read at start-up: normally already there
    if (!state.drawing || state.drawing.layer !== e.layer) return; // cancelled meanwhile
    openEditor(
      "New zone",
      `${geometry.coordinates[0].length - 1} corners.`,
      [
        field("id", "Zone id", "", { required: true, autocomplete: "off" }),
        field("name", "Name", "", { required: true }),
        ...choices,
        numberField("dwell_limit_s", "Dwell limit (s, optional)", "", { min: "1" }),
      ],
      async (v) => {
        const properties = { name: v.name, kind: v.kind };
        if (v.dwell_limit_s !== "") properties.dwell_limit_s = num(v.dwell_limit_s);
        if (v.planned_stop !== "") properties.planned_stop = v.planned_stop === "true";
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

export async function startRouteEdit(id) {
  if (!state.routes.get(id) || state.role !== "admin") return;
  // A route stored before a rule existed lacks its field: the form shows the default the processor
  // applies to it (a field left empty would send null, which switches some rules off).
  const defaults = await routeDefaults(); // read at start-up; normally already there
  const r = state.routes.get(id);
  if (!r) return;
  cancelDrawing();
  r.line.pm.enable({ allowSelfIntersection: true, snappable: true });
  r.line.on("pm:edit", () => r.corridor.setLatLngs(r.line.getLatLngs()));
  state.editing = { id };
  openEditor(
    `Edit route ${id}`,
    "Drag the vertices on the map; change the rules here; Save sends only this version (If-Match).",
    routeFields({ ...defaults, ...r.feature.properties }, false),
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
