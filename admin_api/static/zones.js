// Zones on the map: one dashed polygon per zone, coloured by its kind. The kinds listed here are the
// ones the new-zone form offers (editor.js).

import { state } from "./state.js";

const L = window.L;

export const ZONE_COLOUR = { depot: "#2f6f4f", restricted: "#a12b2b", customer: "#7a4fa8", other: "#56606e" };

export function addZone(feature) {
  const old = state.zones.get(feature.id);
  if (old) old.layer.remove();
  const p = feature.properties;
  const colour = ZONE_COLOUR[p.kind] || ZONE_COLOUR.other;
  const layer = L.geoJSON(feature, {
    style: { color: colour, weight: 2, fillOpacity: 0.12, dashArray: "6 4", className: "zone" },
  }).addTo(state.map);
  layer.bindTooltip(`${p.name} (${p.kind})`, { sticky: true });
  state.zones.set(feature.id, { feature, layer });
}
