// Plain geometry on GeoJSON [lon, lat] coordinates, without Leaflet or the DOM: route lengths for
// the panels, [lat, lon] order for Leaflet, and how wide in pixels a corridor is at a zoom level.

export function haversineM(a, b) {
  const r = 6371008.8;
  const toRad = Math.PI / 180;
  const dLat = (b[1] - a[1]) * toRad;
  const dLon = (b[0] - a[0]) * toRad;
  const h = Math.sin(dLat / 2) ** 2 + Math.cos(a[1] * toRad) * Math.cos(b[1] * toRad) * Math.sin(dLon / 2) ** 2;
  return 2 * r * Math.asin(Math.sqrt(h));
}

export function lineLengthM(coords) {
  let total = 0;
  for (let i = 1; i < coords.length; i += 1) total += haversineM(coords[i - 1], coords[i]);
  return total;
}

export const latlngs = (coords) => coords.map(([lon, lat]) => [lat, lon]);

/** Web Mercator ground resolution at `lat` and map zoom `zoom` (256 px tiles). */
export function metresPerPixel(lat, zoom) {
  return (40075016.686 * Math.cos((lat * Math.PI) / 180)) / 2 ** (zoom + 8);
}

/** The corridor is drawn as a translucent line as wide, in pixels, as corridor_width_m at this zoom. */
export function corridorWeight(route, zoom) {
  const bounds = route.line.getBounds();
  const px = route.feature.properties.corridor_width_m / metresPerPixel(bounds.getCenter().lat, zoom);
  return Math.max(2, Math.min(px, 4000));
}
