// The live feed: trades the API key for a short-lived stream token (EventSource cannot send
// X-API-Key), listens to /api/v1/stream for `positions` and `alert` events, reconnects with backoff,
// and catches up from /api/v1/live and /api/v1/alerts (also the initial load).

import { api, ApiError } from "./api.js";
import { state } from "./state.js";
import { $ } from "./dom.js";
import { addAlert } from "./alerts.js";
import { askForKey } from "./auth.js";
import { renderVehicleList, renderVehiclePanel, scheduleVehicleList, updateVehicle } from "./vehicles.js";

function setStreamState(s, text) {
  document.body.dataset.stream = s;
  $("stream-state").textContent = text;
  $("stream-state").className = `pill ${s}`;
}

export async function connectStream() {
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

export async function loadLive() {
  const [live, alerts] = await Promise.all([api("/api/v1/live?limit=1000"), api("/api/v1/alerts?limit=100")]);
  for (const s of live.data.items) updateVehicle(s);
  for (const a of alerts.data.items) addAlert(a, false);
  renderVehicleList();
  renderVehiclePanel();
}
