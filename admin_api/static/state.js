// The page's shared state: one object that every panel reads and writes, so the modules see the
// map, routes, vehicles and alerts without importing each other. Exposed as window.fleetfence for
// the console and the browser tests (tests/admin_api/test_map.py reads .map and .vehicles).

export const state = {
  map: null,
  role: null,
  routes: new Map(), // id -> {feature, etag, line, corridor, item}
  zones: new Map(), // id -> {feature, layer}
  vehicles: new Map(), // id -> {state, marker, item}
  alerts: new Map(), // id -> {alert, item}
  selectedVehicle: null,
  selectedRoute: null,
  stream: null,
  streamRetryMs: 1000,
  drawing: null, // {kind: "route"|"zone"|"circle", layer} while an unsaved shape is on the map
  editing: null, // {id, layer} while an existing route's geometry is being edited
  zoneEditing: null, // {id, circle} while an existing circle zone is being edited
  zoneClick: null, // what a click on a zone does (set by app.js: the circle editor, for admins)
};
window.fleetfence = state; // for debugging in the console (and the browser tests)
