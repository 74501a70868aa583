// Drawing and editing in the side panel's form (admin keys): draw a new route, zone or circle zone
// with Geoman, edit an existing route's vertices and rules or a circle zone's centre and radius
// (drag them on the map, or type them), and save through the API with its own validation messages
// and If-Match conflicts shown next to the form.

import { api, ApiError } from "./api.js";
import { state } from "./state.js";
import { $, el, fmtKm, say, showPanel } from "./dom.js";
import { lineLengthM } from "./geo.js";
import { addRoute, selectRoute } from "./routes.js";
import { routeDefaults, routeRules, zoneSchema } from "./schema.js";
import { addZone, fmtRadius, isCircle, ZONE_COLOUR } from "./zones.js";

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
  form.oninput = null; // a circle's form keeps the circle in step (linkCircle); no other form does
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

// The route's rules, as the API's schema lists them (schema.js routeRules). The form sends all of them
// on every save: a PUT replaces the whole route, so a rule the form left out would silently fall
// back to its default.
function routeProps(values, rules) {
  const props = { name: values.name };
  for (const r of rules) props[r.name] = r.nullable ? numOrNull(values[r.name]) : num(values[r.name]);
  return props;
}

function ruleField(r, p) {
  const attrs = r.min === undefined ? {} : { min: String(r.min) };
  if (r.integer) attrs.step = "1";
  return numberField(r.name, r.title, p[r.name], attrs);
}

function routeFields(p, withId, rules) {
  return [
    withId ? field("id", "Route id", "", { required: true, autocomplete: "off" }) : null,
    field("name", "Name", p.name, { required: true }),
    ...rules.filter((r) => !r.trip).map((r) => ruleField(r, p)),
    el(
      "fieldset",
      { class: "rules", id: "trip-rules" },
      el("legend", { text: "Trip: direction, stops, arrival" }),
      ...rules.filter((r) => r.trip).map((r) => ruleField(r, p)),
    ),
  ].filter(Boolean);
}

/** The zone form's kind and planned-stop choices, from the API's schema when it could be read
 * (else the kinds this page has colours for, and no explanation). */
async function zoneChoices(current = {}) {
  const schema = await zoneSchema();
  const kinds = schema ? schema.kinds : Object.keys(ZONE_COLOUR);
  const chosen = kinds.includes(current.kind)
    ? current.kind
    : schema && kinds.includes(schema.defaultKind)
      ? schema.defaultKind
      : kinds[0];
  const stop = current.planned_stop === true ? "true" : current.planned_stop === false ? "false" : "";
  const kindSelect = el(
    "select",
    { id: "f-kind", name: "kind" },
    ...kinds.map((k) => el("option", { value: k, text: k.replaceAll("_", " "), selected: k === chosen })),
  );
  const help = schema && schema.plannedStopHelp;
  const stopSelect = el(
    "select",
    { id: "f-planned_stop", name: "planned_stop", "aria-describedby": help ? "f-planned_stop-help" : null },
    el("option", { value: "", text: "by kind", selected: stop === "" }),
    el("option", { value: "true", text: "yes", selected: stop === "true" }),
    el("option", { value: "false", text: "no", selected: stop === "false" }),
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
  const shape = kind === "route" ? "Line" : kind === "circle" ? "Circle" : "Polygon";
  // A quick second click on the last vertex finishes the shape; it must not also zoom the map.
  state.map.doubleClickZoom.disable();
  state.map.pm.enableDraw(shape, { snappable: true, continueDrawing: false });
  state.drawing = { kind, layer: null };
  say(
    kind === "route"
      ? "Drawing a route: click to add points; click the last point again (or press Enter) to finish; Esc cancels."
      : kind === "circle"
        ? "Drawing a circle zone: click its centre, then click again at its radius; Esc cancels."
        : "Drawing a zone: click to add corners; click the first corner (or press Enter) to close it; Esc cancels.",
  );
}

export function cancelDrawing() {
  state.map.pm.disableDraw();
  state.map.doubleClickZoom.enable();
  if (state.drawing && state.drawing.layer) state.drawing.layer.remove();
  state.drawing = null;
  if (state.editing) stopRouteEdit(true);
  if (state.zoneEditing) stopZoneEdit(true);
}

export async function onShapeDrawn(e) {
  const kind = state.drawing
    ? state.drawing.kind
    : e.shape === "Line"
      ? "route"
      : e.shape === "Circle"
        ? "circle"
        : "zone";
  state.drawing = { kind, layer: e.layer };
  state.map.doubleClickZoom.enable();
  say("");
  if (kind === "circle") return newCircleZone(e.layer);
  const geometry = e.layer.toGeoJSON(6).geometry;
  if (kind === "route") {
    const defaults = await routeDefaults(); // read at start-up; normally already there
    const rules = await routeRules();
    if (!state.drawing || state.drawing.layer !== e.layer) return; // cancelled meanwhile
    openEditor(
      "New route",
      `${geometry.coordinates.length} points, ${fmtKm(lineLengthM(geometry.coordinates))}.`,
      routeFields({ ...REQUIRED_RULE_SUGGESTIONS, ...defaults, name: "" }, true, rules),
      async (v) => {
        const feature = { type: "Feature", id: v.id, geometry, properties: routeProps(v, rules) };
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
        const properties = zoneProps(v);
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
  const rules = await routeRules();
  const r = state.routes.get(id);
  if (!r) return;
  cancelDrawing();
  r.line.pm.enable({ allowSelfIntersection: true, snappable: true });
  r.line.on("pm:edit", () => r.corridor.setLatLngs(r.line.getLatLngs()));
  state.editing = { id };
  openEditor(
    `Edit route ${id}`,
    "Drag the vertices on the map; change the rules here; Save sends only this version (If-Match).",
    routeFields({ ...defaults, ...r.feature.properties }, false, rules),
    async (v) => {
      const geometry = r.line.toGeoJSON(6).geometry;
      const body = { type: "Feature", id, geometry, properties: routeProps(v, rules) };
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

// ---------------------------------------------------------------------------------- circle zones

function zoneProps(v) {
  const properties = { name: v.name, kind: v.kind };
  if (v.dwell_limit_s !== "") properties.dwell_limit_s = num(v.dwell_limit_s);
  if (v.planned_stop !== "") properties.planned_stop = v.planned_stop === "true";
  return properties;
}

/** The form's centre and radius as the API's circle: a GeoJSON Point with radius_m. A number left
 * empty or unreadable goes as null, and the API's 422 names it. */
function circleGeometry(v) {
  const n = (x) => (Number.isFinite(num(x)) ? num(x) : null);
  return { type: "Point", coordinates: [n(v.centre_lon), n(v.centre_lat)], radius_m: n(v.radius_m) };
}

function circleFields(latlng, radius) {
  return [
    numberField("centre_lat", "Centre latitude", latlng.lat.toFixed(6), { min: "-85", max: "85" }),
    numberField("centre_lon", "Centre longitude", latlng.lng.toFixed(6), { min: "-180", max: "180" }),
    numberField("radius_m", "Radius (m)", Math.round(radius * 10) / 10, { min: "0.1" }),
  ];
}

/** Keep the circle on the map and the form's centre and radius in step, both ways: typing moves the
 * circle, dragging its centre or its radius handle (Geoman) rewrites the fields. */
function linkCircle(circle) {
  const form = $("editor");
  form.oninput = () => {
    const lat = num(form.elements.centre_lat.value);
    const lon = num(form.elements.centre_lon.value);
    const r = num(form.elements.radius_m.value);
    if (Number.isFinite(lat) && Number.isFinite(lon)) circle.setLatLng([lat, lon]);
    if (Number.isFinite(r) && r > 0) circle.setRadius(r);
  };
  const fill = () => {
    const c = circle.getLatLng();
    form.elements.centre_lat.value = c.lat.toFixed(6);
    form.elements.centre_lon.value = c.lng.toFixed(6);
    form.elements.radius_m.value = Math.round(circle.getRadius() * 10) / 10;
  };
  circle.on("pm:edit pm:markerdrag pm:centerplaced", fill);
}

async function newCircleZone(layer) {
  const choices = await zoneChoices(); // the schema was read at start-up: normally already there
  if (!state.drawing || state.drawing.layer !== layer) return; // cancelled meanwhile
  openEditor(
    "New circle zone",
    "Inside means within the radius of the centre. Type the centre and radius, or drag them on the map.",
    [
      field("id", "Zone id", "", { required: true, autocomplete: "off" }),
      field("name", "Name", "", { required: true }),
      ...circleFields(layer.getLatLng(), layer.getRadius()),
      ...choices,
      numberField("dwell_limit_s", "Dwell limit (s, optional)", "", { min: "1" }),
    ],
    async (v) => {
      const body = { type: "Feature", id: v.id, geometry: circleGeometry(v), properties: zoneProps(v) };
      const { data } = await api("/api/v1/zones", { method: "POST", body });
      layer.remove();
      state.drawing = null;
      closeEditor();
      addZone(data);
      say(`Zone ${data.id} saved (version ${data.properties.version}, radius ${fmtRadius(data.geometry.radius_m)}).`, "ok");
    },
    cancelDrawing,
  );
  layer.pm.enable();
  linkCircle(layer);
}

/** Edit a circle zone (admin keys): its centre and radius on the map or in the form, its other
 * properties in the form; Save replaces this version only (If-Match). Polygon zones are not edited
 * here (draw them anew, or use the API). */
export async function startZoneEdit(id) {
  const z = state.zones.get(id);
  if (!z || state.role !== "admin" || state.drawing || !isCircle(z.feature)) return;
  if (state.zoneEditing && state.zoneEditing.id === id) return;
  const choices = await zoneChoices(z.feature.properties);
  cancelDrawing();
  const current = state.zones.get(id);
  if (!current) return;
  const circle = current.layer.getLayers()[0];
  const p = current.feature.properties;
  state.zoneEditing = { id, circle };
  openEditor(
    `Edit circle zone ${id}`,
    "Drag the centre or the radius handle on the map, or type them; Save sends only this version (If-Match).",
    [
      field("name", "Name", p.name, { required: true }),
      ...circleFields(circle.getLatLng(), circle.getRadius()),
      ...choices,
      numberField("dwell_limit_s", "Dwell limit (s, optional)", p.dwell_limit_s, { min: "1" }),
    ],
    async (v) => {
      const body = { type: "Feature", id, geometry: circleGeometry(v), properties: zoneProps(v) };
      const ifMatch = `"${p.version}"`;
      try {
        const { data } = await api(`/api/v1/zones/${encodeURIComponent(id)}`, { method: "PUT", body, ifMatch });
        stopZoneEdit(false);
        closeEditor();
        addZone(data);
        say(`Zone ${id} saved (version ${data.properties.version}, radius ${fmtRadius(data.geometry.radius_m)}).`, "ok");
      } catch (err) {
        if (err instanceof ApiError && err.status === 412) {
          throw new ApiError(
            412,
            `someone else changed zone ${id} since you opened it (now version ${(err.etag || "?").replaceAll('"', "")}). ` +
              "Cancel, then edit the current version.",
          );
        }
        throw err;
      }
    },
    () => stopZoneEdit(true),
  );
  circle.pm.enable();
  linkCircle(circle);
}

async function stopZoneEdit(reload) {
  const edit = state.zoneEditing;
  state.zoneEditing = null;
  if (!edit) return;
  edit.circle.pm.disable();
  if (reload) {
    try {
      const { data } = await api(`/api/v1/zones/${encodeURIComponent(edit.id)}`);
      addZone(data);
    } catch (err) {
      say(`Could not reload zone ${edit.id}: ${err.message}`, "error");
    }
  }
}
