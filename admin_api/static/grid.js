// A plain latitude/longitude grid drawn on canvas tiles: the base layer when no tile server is
// configured, so the map is usable offline and the page makes no request outside its own server.

const STEPS_DEG = [30, 10, 5, 2, 1, 0.5, 0.2, 0.1, 0.05, 0.02, 0.01, 0.005, 0.002, 0.001, 0.0005, 0.0002, 0.0001];
const MIN_SPACING_PX = 90;

function stepFor(zoom) {
  const degPerPx = 360 / (256 * 2 ** zoom);
  for (let i = STEPS_DEG.length - 1; i >= 0; i -= 1) {
    if (STEPS_DEG[i] / degPerPx >= MIN_SPACING_PX) return STEPS_DEG[i];
  }
  return STEPS_DEG[0];
}

function label(value, step, pos, neg) {
  const decimals = Math.max(0, Math.ceil(-Math.log10(step)));
  const hemi = value > 0 ? pos : value < 0 ? neg : "";
  return `${Math.abs(value).toFixed(decimals)}°${hemi}`;
}

export function gridLayer(L) {
  const Grid = L.GridLayer.extend({
    createTile(coords) {
      const tile = document.createElement("canvas");
      const size = this.getTileSize();
      tile.width = size.x;
      tile.height = size.y;
      const ctx = tile.getContext("2d");
      ctx.fillStyle = "#f3f4f1";
      ctx.fillRect(0, 0, size.x, size.y);
      const map = this._map;
      const z = coords.z;
      const origin = coords.scaleBy(size);
      const nw = map.unproject(origin, z);
      const se = map.unproject(origin.add(size), z);
      const step = stepFor(z);
      ctx.strokeStyle = "#c9ccd1";
      ctx.lineWidth = 1;
      ctx.fillStyle = "#4a5361";
      ctx.font = "11px system-ui, sans-serif";
      for (let lon = Math.ceil(nw.lng / step) * step; lon <= se.lng; lon += step) {
        const x = Math.round(map.project([nw.lat, lon], z).x - origin.x) + 0.5;
        ctx.beginPath();
        ctx.moveTo(x, 0);
        ctx.lineTo(x, size.y);
        ctx.stroke();
        const text = label(lon, step, "E", "W");
        if (x + 3 + ctx.measureText(text).width < size.x) ctx.fillText(text, x + 3, 12);
      }
      for (let lat = Math.ceil(se.lat / step) * step; lat <= nw.lat; lat += step) {
        const y = Math.round(map.project([lat, nw.lng], z).y - origin.y) + 0.5;
        ctx.beginPath();
        ctx.moveTo(0, y);
        ctx.lineTo(size.x, y);
        ctx.stroke();
        if (y > 26) ctx.fillText(label(lat, step, "N", "S"), 3, y - 3);
      }
      return tile;
    },
  });
  return new Grid({ attribution: "lat/lon grid (no tile server configured)" });
}
