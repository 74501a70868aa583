// What the page takes from the API's own OpenAPI schema (/openapi.json, served without a key): the
// route rules with their words and defaults, and the zone kinds with what `planned_stop` means. The forms then
// offer exactly what the server would apply and accept, and these keep one home, the Python models
// (vehicle_master.models.RouteProps and ZoneProps), instead of a copy here that could drift from them.

import { api } from "./api.js";
import { say } from "./dom.js";

const ROUTES_PATH = "/api/v1/routes";
const ZONES_PATH = "/api/v1/zones";
let loaded = null;

/** A schema node with its "#/..." $ref chain followed inside `doc`. */
function deref(doc, node) {
  let n = node;
  for (let hops = 0; n && n.$ref && hops < 20; hops += 1) {
    n = n.$ref.replace(/^#\//, "").split("/").reduce((at, key) => (at ? at[key] : undefined), doc);
  }
  return n;
}

/** The schema of the Feature `properties` that POST `path` accepts. */
function postedProperties(doc, path) {
  const post = doc.paths?.[path]?.post;
  const feature = deref(doc, post?.requestBody?.content?.["application/json"]?.schema);
  const props = deref(doc, feature?.properties?.properties);
  if (!props || !props.properties) throw new Error(`no schema for the properties of POST ${path}`);
  return props.properties;
}

/** {field: default} of the route `properties` that POST /api/v1/routes accepts (a rule whose
 * default is null, i.e. unset, is left out). */
export function routeDefaultsFrom(doc) {
  const out = {};
  for (const [name, s] of Object.entries(postedProperties(doc, ROUTES_PATH))) {
    if (s.default !== undefined && s.default !== null) out[name] = s.default;
  }
  return out;
}

/** The route rules the form offers, in the model's order (the properties the schema marks `x-rule`,
 * fleetfence.rules.RouteRules' fields): {name, title, trip, nullable, integer, min}. */
export function routeRulesFrom(doc) {
  const out = [];
  for (const [name, s] of Object.entries(postedProperties(doc, ROUTES_PATH))) {
    if (!s["x-rule"]) continue;
    const types = s.anyOf || [s];
    const value = types.find((t) => t.type !== "null") || {};
    out.push({
      name,
      title: s.title || name,
      trip: s["x-rule"] === "trip",
      nullable: types.some((t) => t.type === "null"),
      integer: value.type === "integer",
      min: value.minimum ?? value.exclusiveMinimum,
    });
  }
  if (!out.length) throw new Error(`no route rules in the schema of POST ${ROUTES_PATH}`);
  return out;
}

/** The zone form's choices: `kinds` (the ZoneKind enum, in the model's order), the default kind,
 * and the description of `planned_stop` (which kinds are planned stops when it is null). */
export function zoneSchemaFrom(doc) {
  const props = postedProperties(doc, ZONES_PATH);
  const kind = props.kind || {};
  const kinds = deref(doc, kind)?.enum; // {"$ref": "#/components/schemas/ZoneKind", "default": ...}
  if (!Array.isArray(kinds) || !kinds.length) throw new Error(`no zone kinds in the schema of POST ${ZONES_PATH}`);
  return { kinds, defaultKind: kind.default ?? null, plannedStopHelp: props.planned_stop?.description || "" };
}

async function loadDoc() {
  try {
    return (await api("/openapi.json")).data;
  } catch (err) {
    say(`Could not read the API's schema from /openapi.json: ${err.message}`, "error");
    return null;
  }
}

function doc() {
  if (!loaded) loaded = loadDoc();
  return loaded;
}

/** The route rules' defaults, read once (the first call fetches; later calls share the answer). */
export async function routeDefaults() {
  const d = await doc();
  if (!d) return {};
  try {
    return routeDefaultsFrom(d);
  } catch (err) {
    say(`Could not read the route rules' defaults from /openapi.json: ${err.message}`, "error");
    return {};
  }
}

/** The route rules the form offers (empty when the schema could not be read). */
export async function routeRules() {
  const d = await doc();
  if (!d) return [];
  try {
    return routeRulesFrom(d);
  } catch (err) {
    say(`Could not read the route rules from /openapi.json: ${err.message}`, "error");
    return [];
  }
}

/** The zone kinds and planned_stop's meaning (null when the schema could not be read). */
export async function zoneSchema() {
  const d = await doc();
  if (!d) return null;
  try {
    return zoneSchemaFrom(d);
  } catch (err) {
    say(`Could not read the zone kinds from /openapi.json: ${err.message}`, "error");
    return null;
  }
}
