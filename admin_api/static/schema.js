// What the page takes from the API's own OpenAPI schema (/openapi.json, served without a key): the
// defaults of the route rules. The new-route form then offers exactly what the server would apply,
// and the numbers keep one home, the Python model (vehicle_master.models.RouteProps), instead of a
// copy here that could drift from it.

import { api } from "./api.js";
import { say } from "./dom.js";

const ROUTES_PATH = "/api/v1/routes";
let loaded = null;

/** A schema node with its "#/..." $ref chain followed inside `doc`. */
function deref(doc, node) {
  let n = node;
  for (let hops = 0; n && n.$ref && hops < 20; hops += 1) {
    n = n.$ref.replace(/^#\//, "").split("/").reduce((at, key) => (at ? at[key] : undefined), doc);
  }
  return n;
}

/** {field: default} of the route `properties` that POST /api/v1/routes accepts. */
export function routeDefaultsFrom(doc) {
  const post = doc.paths?.[ROUTES_PATH]?.post;
  const feature = deref(doc, post?.requestBody?.content?.["application/json"]?.schema);
  const props = deref(doc, feature?.properties?.properties);
  if (!props || !props.properties) throw new Error(`no schema for the properties of POST ${ROUTES_PATH}`);
  const out = {};
  for (const [name, s] of Object.entries(props.properties)) {
    if (s.default !== undefined && s.default !== null) out[name] = s.default;
  }
  return out;
}

async function load() {
  try {
    return routeDefaultsFrom((await api("/openapi.json")).data);
  } catch (err) {
    say(`Could not read the route rules' defaults from /openapi.json: ${err.message}`, "error");
    return {};
  }
}

/** The route rules' defaults, read once (the first call fetches; later calls share the answer). */
export function routeDefaults() {
  if (!loaded) loaded = load();
  return loaded;
}
