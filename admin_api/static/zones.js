// Zones on the map: one dashed polygon per zone, coloured by its kind. The new-zone form offers the
// kinds of the API's schema (schema.js); a kind without a colour here is drawn as "other".

import { state } from "./state.js";

const L = window.L;

export const ZONE_COLOUR = {
  depot: "#2f6f4f",
  restricted: "#a12b2b",
  customer: "#7a4fa8",
  rest_area: "#1f6f8b",
  other: "#56606e",
};

export function addZone(feature) {
  const old = state.zones.get(feature.id);
  if (old) old.layer.remove();
  const p = feature.properties;
  const colour = ZONE_COLOUR[p.kind] || ZONE_COLOUR.other;
  const layer = L.geoJSON(feature, {
    style: { color: colour, weight: 2, fillOpacity: 0.12, dashArray: "6 4", className: "zone" },
  }).addTo(state.map);
  // planned_stop null means "as the kind says": only an explicit choice is worth a word here.
  const stop = p.planned_stop === true ? ", planned stop" : p.planned_stop === false ? ", not a planned stop" : "";
  layer.bindTooltip(`${p.name} (${p.kind.replaceAll("_", " ")}${stop})`, { sticky: true });
  state.zones.set(feature.id, { feature, layer });
}
