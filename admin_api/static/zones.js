// Zones on the map: one dashed polygon per zone, coloured by its kind, or a dashed circle for a
// circle zone (a GeoJSON Point with radius_m, drawn with its radius in metres). The new-zone form
// offers the kinds of the API's schema (schema.js); a kind without a colour here is drawn as "other".

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
  const circle = isCircle(feature);
  const layer = L.geoJSON(feature, {
    style: { color: colour, weight: 2, fillOpacity: 0.12, dashArray: "6 4", className: circle ? "zone zone-circle" : "zone" },
    pointToLayer: (f, latlng) => L.circle(latlng, { radius: f.geometry.radius_m }),
  }).addTo(state.map);
  // planned_stop null means "as the kind says": only an explicit choice is worth a word here.
  const stop = p.planned_stop === true ? ", planned stop" : p.planned_stop === false ? ", not a planned stop" : "";
  const radius = circle ? `, radius ${fmtRadius(feature.geometry.radius_m)}` : "";
  layer.bindTooltip(`${p.name} (${p.kind.replaceAll("_", " ")}${radius}${stop})`, { sticky: true });
  layer.on("click", () => {
    if (state.zoneClick) state.zoneClick(feature.id);
  });
  state.zones.set(feature.id, { feature, layer });
}

/** A circle zone: its geometry is a Point with radius_m. */
export function isCircle(feature) {
  return feature.geometry && feature.geometry.type === "Point";
}

export function fmtRadius(m) {
  return m >= 1000 ? `${(m / 1000).toFixed(2)} km` : `${Math.round(m * 10) / 10} m`;
}
