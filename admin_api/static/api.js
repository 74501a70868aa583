// The admin API as the map uses it: one fetch wrapper that sends the API key, turns the API's
// problem bodies (FastAPI's {detail: "..."} or {detail: [{loc, msg}]}) into readable text, and
// keeps the key in sessionStorage so it is entered once per browser tab and never persisted.

const KEY_STORAGE = "fleetfence.apiKey";

export class ApiError extends Error {
  constructor(status, message, etag) {
    super(message);
    this.status = status;
    this.etag = etag;
  }
}

export function getKey() {
  return sessionStorage.getItem(KEY_STORAGE);
}

export function setKey(key) {
  sessionStorage.setItem(KEY_STORAGE, key);
}

export function clearKey() {
  sessionStorage.removeItem(KEY_STORAGE);
}

/** FastAPI problem body -> one line per problem, e.g. "properties.corridor_width_m: ...". */
export function problemText(status, body) {
  const detail = body && body.detail;
  if (typeof detail === "string") return detail;
  if (Array.isArray(detail)) {
    return detail
      .map((d) => {
        const loc = (d.loc || []).filter((p) => p !== "body").join(".");
        return loc ? `${loc}: ${d.msg}` : d.msg;
      })
      .join("\n");
  }
  return `HTTP ${status}`;
}

export async function api(path, { method = "GET", body, ifMatch } = {}) {
  const headers = { Accept: "application/json" };
  const key = getKey();
  if (key) headers["X-API-Key"] = key;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (ifMatch) headers["If-Match"] = ifMatch;
  const res = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    cache: "no-store",
  });
  const etag = res.headers.get("ETag");
  const text = res.status === 204 ? "" : await res.text();
  let data = null;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = { detail: text.slice(0, 300) };
    }
  }
  if (!res.ok) throw new ApiError(res.status, problemText(res.status, data), etag);
  return { data, etag };
}

/** What a write answered besides its success (e.g. an assignment's `warnings`): non-empty strings. */
export function warningsOf(data) {
  const w = data && data.warnings;
  return Array.isArray(w) ? w.filter((x) => typeof x === "string" && x) : [];
}

/** Every page of a list endpoint (routes/zones/vehicles page by `after`, live/alerts by `offset`). */
export async function listAll(path, field, max = 5000) {
  const out = [];
  let after = null;
  for (;;) {
    const sep = path.includes("?") ? "&" : "?";
    const url = after === null ? `${path}${sep}limit=1000` : `${path}${sep}limit=1000&after=${encodeURIComponent(after)}`;
    const { data } = await api(url);
    out.push(...data[field]);
    after = data.next_after;
    if (!after || out.length >= max) return out;
  }
}
