// A vehicle's MQTT credentials in the vehicle panel: their status (GET .../vehicles/{id}/credentials,
// "no credentials" while never issued) and, for admin keys, the actions the status allows: issue, rotate,
// disable, enable, revoke. Mosquitto applies each at once (rotating, disabling or revoking cuts a
// connected vehicle off).
//
// The password is in the answer of issue and rotate only. It is shown in its own box, once: it lives
// in that box's text and nowhere else (not in the shared state, not in any storage), and the box is
// emptied when a vehicle is selected again, so the next look at the vehicle no longer shows it.
// The status part is drawn apart from the live part of the panel (#vehicle-panel), whose redraw on
// every position must not take the box, or a half-done click, away.

import { api } from "./api.js";
import { state } from "./state.js";
import { $, el, fmtTime, say } from "./dom.js";

const STATUS_TEXT = {
  active: "active",
  disabled: "disabled: the vehicle cannot log in until enabled",
  revoked: "revoked: the vehicle cannot log in",
};

// What each button does; `secret`: the answer carries a password, shown once.
const ACTIONS = {
  issue: { label: "Issue credentials", method: "POST", path: "", secret: true, verb: "issue", done: "issued" },
  rotate: { label: "Rotate password", method: "POST", path: "/rotate", secret: true, verb: "rotate", done: "rotated" },
  disable: { label: "Disable", method: "POST", path: "/disable", verb: "disable", done: "disabled" },
  enable: { label: "Enable", method: "POST", path: "/enable", verb: "enable", done: "enabled" },
  revoke: { label: "Revoke", method: "DELETE", path: "", verb: "revoke", done: "revoked" },
};

/** The actions that apply to a status (null: never issued). Rotating keeps a disabled vehicle disabled. */
function actionsFor(status) {
  if (status === "active") return ["rotate", "disable", "revoke"];
  if (status === "disabled") return ["enable", "rotate", "revoke"];
  return ["issue"]; // none yet, or revoked: issuing gives new ones
}

function credentialsPath(id) {
  return `/api/v1/vehicles/${encodeURIComponent(id)}/credentials`;
}

function fmtIso(iso) {
  const ms = Date.parse(iso);
  return Number.isNaN(ms) ? iso : fmtTime(ms);
}

// Bumped by every selection of a vehicle: an answer that arrives after another selection is dropped.
let generation = 0;

/** vehicles.js, when a vehicle is selected: read its credential status afresh, no password shown. */
export function showCredentials(id) {
  generation += 1;
  $("credentials-secret").replaceChildren();
  const box = $("credentials-panel");
  box.dataset.vehicleId = id;
  box.dataset.status = "loading";
  box.replaceChildren(el("p", { class: "sub", text: "Reading the credential status…" }));
  loadCredentials(id, generation);
}

async function loadCredentials(id, gen) {
  let rec = null;
  let problem = null;
  try {
    rec = (await api(credentialsPath(id))).data;
    if (rec.status === "none") rec = null; // never issued
  } catch (err) {
    problem = err;
  }
  if (gen !== generation) return;
  renderCredentials(id, rec, problem);
  if (problem) say(`MQTT credentials of ${id}: ${problem.message}`, "error");
}

function renderCredentials(id, rec, problem) {
  const box = $("credentials-panel");
  const status = rec ? rec.status : null;
  let rows;
  if (problem) {
    rows = [["Status", `unknown: ${problem.message}`]];
  } else if (!rec) {
    rows = [["Status", "no credentials"]];
  } else {
    rows = [
      ["Status", STATUS_TEXT[rec.status] || rec.status],
      ["Username", rec.username],
      ["Issued", fmtIso(rec.issued_at)],
      ["Rotated", rec.rotated_at ? fmtIso(rec.rotated_at) : "never"],
    ];
    if (rec.disabled_at) rows.push(["Disabled", fmtIso(rec.disabled_at)]);
    if (rec.revoked_at) rows.push(["Revoked", fmtIso(rec.revoked_at)]);
  }
  box.dataset.vehicleId = id;
  box.dataset.status = problem ? "unknown" : status || "none";
  const parts = [el("dl", { class: "facts" }, ...rows.flatMap(([k, v]) => [el("dt", { text: k }), el("dd", { text: v })]))];
  if (state.role === "admin" && !problem) {
    parts.push(
      el(
        "div",
        { class: "actions cred-actions", role: "group", "aria-label": `MQTT credentials of ${id}` },
        ...actionsFor(status).map((name) =>
          el("button", { type: "button", "data-action": name, text: ACTIONS[name].label, onclick: () => act(id, name) }),
        ),
      ),
    );
  }
  box.replaceChildren(...parts);
}

async function act(id, name) {
  const a = ACTIONS[name];
  const gen = generation;
  for (const b of $("credentials-panel").querySelectorAll("button")) b.disabled = true;
  try {
    const { data } = await api(`${credentialsPath(id)}${a.path}`, { method: a.method });
    // A password must reach the admin even if another vehicle was selected meanwhile: the box names
    // the vehicle, and it is the only chance to see it.
    if (a.secret) showSecret(data);
    say(`MQTT credentials of ${id} ${a.done}.`, "ok");
    if (gen === generation) renderCredentials(id, data, null);
  } catch (err) {
    say(`Could not ${a.verb} the MQTT credentials of ${id}: ${err.message}`, "error");
    // Show what the API has now (someone else may have changed it; the buttons follow).
    if (gen === generation) loadCredentials(id, gen);
  }
}

/** The password of an issue or rotate answer, with the topic, in a marked box that says it is shown once. */
function showSecret(data) {
  const id = data.vehicle_id;
  const rows = [
    ["Username", data.username],
    ["Password", data.password],
    ["Topic", data.topic],
  ];
  const box = el(
    "div",
    { class: "secret-box", id: "credentials-secret-box", role: "region", "aria-labelledby": "secret-title", tabindex: "-1", "data-vehicle-id": id },
    el("p", { class: "secret-title", id: "secret-title", text: `New MQTT password for ${id}: shown once` }),
    el(
      "dl",
      { class: "facts" },
      ...rows.flatMap(([k, v]) => [el("dt", { text: k }), el("dd", {}, el("code", { class: k === "Password" ? "secret" : null, text: v }))]),
    ),
    el("p", {
      class: "secret-note",
      text: "Store it in the vehicle now: it will not be shown again (FleetFence does not keep it). Lost it? Rotate the password.",
    }),
    el("button", { type: "button", text: "Hide password", onclick: () => box.remove() }),
  );
  $("credentials-secret").replaceChildren(box);
  box.focus();
}
