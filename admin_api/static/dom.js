// Small DOM and text helpers every panel uses: element building, keyboard-activatable list items,
// the status message line, the side panel drawer, and how times and distances are written.

import { state } from "./state.js";

export const $ = (id) => document.getElementById(id);

export function el(tag, attrs = {}, ...children) {
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
export function activatable(e, handler) {
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

export function say(text, kind = "info") {
  const m = $("message");
  m.textContent = text;
  m.className = `message ${kind}`;
  m.hidden = !text;
}

export function showPanel(open) {
  document.body.classList.toggle("panel-closed", !open);
  $("toggle-panel").setAttribute("aria-expanded", String(open));
  setTimeout(() => state.map && state.map.invalidateSize(), 0);
}

export function fmtTime(ms) {
  return new Date(ms).toISOString().replace("T", " ").slice(0, 19) + " UTC";
}

export function ago(ms) {
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (s < 90) return `${s} s ago`;
  if (s < 5400) return `${Math.round(s / 60)} min ago`;
  return `${Math.round(s / 3600)} h ago`;
}

export function fmtKm(m) {
  return m >= 1000 ? `${(m / 1000).toFixed(2)} km` : `${Math.round(m)} m`;
}

/** A length of time in seconds, in the unit a person reads it in: "45 s", "12 min", "2 h 05 min". */
export function fmtDuration(seconds) {
  const s = Math.max(0, Math.round(seconds));
  if (s < 90) return `${s} s`;
  const min = Math.round(s / 60);
  if (min < 90) return `${min} min`;
  return `${Math.floor(min / 60)} h ${String(min % 60).padStart(2, "0")} min`;
}

/** The ETA against the plan (the API's `delay_s`, positive when late) in whole minutes with its
 * sign: "+12 min (late)", "-3 min (early)", "0 min (on time)". */
export function fmtDelay(delayS) {
  const min = Math.round(delayS / 60);
  if (min > 0) return `+${min} min (late)`;
  if (min < 0) return `-${-min} min (early)`;
  return "0 min (on time)";
}
