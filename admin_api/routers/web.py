"""The live operations map: one static page (admin_api/static) and the front-end libraries it uses.

Our page code is plain ES modules committed in admin_api/static; Leaflet and Geoman come from npm
(`npm ci --prefix web`, never committed) and are served from `FLEETFENCE_API_WEB_VENDOR_DIR`. The
page loads nothing from anywhere else: its Content-Security-Policy allows only this origin, plus the
tile server's when FLEETFENCE_API_MAP_TILE_URL is set, so a forgotten CDN link fails loudly in the
browser instead of silently needing the internet.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from admin_api.responses import OrjsonResponse
from admin_api.settings import ApiSettings
from fleetfence import __version__
from fleetfence.contracts import AlertType

logger = logging.getLogger(__name__)
router = APIRouter(include_in_schema=False)

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
# URL name under /static/vendor -> the npm package's dist folder inside node_modules.
VENDOR_PACKAGES = {
    "leaflet": Path("leaflet/dist"),
    "leaflet-geoman": Path("@geoman-io/leaflet-geoman-free/dist"),
}
# Every vendor file index.html references; one missing means the page cannot work.
VENDOR_FILES = (
    "leaflet/leaflet.js",
    "leaflet/leaflet.css",
    "leaflet-geoman/leaflet-geoman.min.js",
    "leaflet-geoman/leaflet-geoman.css",
)
NPM_HINT = "npm ci --prefix web --no-audit --no-fund"


class VendorFiles(StaticFiles):
    """StaticFiles that answers 404 (not 500) while the folder does not exist yet, and serves it as
    soon as `npm ci` has created it, without a restart."""

    async def check_config(self) -> None:
        if self.directory is not None and Path(self.directory).is_dir():
            await super().check_config()


def missing_vendor_files(vendor_dir: Path) -> list[str]:
    """The files of VENDOR_FILES absent from `vendor_dir` (a node_modules folder)."""
    out = []
    for rel in VENDOR_FILES:
        name, _, file = rel.partition("/")
        if not (vendor_dir / VENDOR_PACKAGES[name] / file).is_file():
            out.append(rel)
    return out


def tile_origin(tile_url: str) -> str | None:
    """The CSP source for a tile URL template; `{s}` subdomains become a wildcard."""
    if not tile_url:
        return None
    parts = urlsplit(tile_url.replace("{s}", "*"))
    return f"{parts.scheme}://{parts.netloc}"


def content_security_policy(tile_url: str) -> str:
    img = " ".join(s for s in ("'self'", "data:", "blob:", tile_origin(tile_url)) if s)
    # Leaflet and Geoman position elements with inline style attributes: styles need 'unsafe-inline',
    # scripts never do.
    return (
        "default-src 'self'; script-src 'self'; connect-src 'self'; "
        f"img-src {img}; style-src 'self' 'unsafe-inline'; font-src 'self'; "
        "object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'none'"
    )


def mount_static(app: FastAPI, settings: ApiSettings) -> None:
    """Serve our page code and the vendored libraries; warn at start-up when npm ci has not run."""
    app.mount("/static/app", StaticFiles(directory=STATIC_DIR), name="map-app")
    for name, dist in VENDOR_PACKAGES.items():
        app.mount(
            f"/static/vendor/{name}",
            VendorFiles(directory=settings.api_web_vendor_dir / dist, check_dir=False),
            name=f"vendor-{name}",
        )
    missing = missing_vendor_files(settings.api_web_vendor_dir)
    if missing:
        logger.warning(
            "the map's front-end libraries are missing from %s (%s): run `%s`; /map answers 503 until then",
            settings.api_web_vendor_dir,
            ", ".join(missing),
            NPM_HINT,
        )


def _settings(request: Request) -> ApiSettings:
    settings: ApiSettings = request.app.state.settings
    return settings


def _missing_page(vendor_dir: Path, missing: list[str]) -> HTMLResponse:
    body = (
        "<!doctype html><html lang=en><head><meta charset=utf-8><title>FleetFence map unavailable</title>"
        "</head><body style='font-family:sans-serif;max-width:40em;margin:3em auto'>"
        "<h1>The map's front-end libraries are not installed</h1>"
        f"<p>Run <code>{NPM_HINT}</code> in the repository (or set FLEETFENCE_API_WEB_VENDOR_DIR to a "
        f"node_modules folder that has them). Missing under <code>{vendor_dir}</code>: "
        f"<code>{', '.join(missing)}</code>.</p></body></html>"
    )
    return HTMLResponse(body, status_code=503, headers={"Retry-After": "60", "Cache-Control": "no-store"})


@router.get("/", response_class=HTMLResponse)
@router.get("/map", response_class=HTMLResponse)
async def map_page(request: Request) -> Response:
    """The map; 503 with the install command when the vendored libraries are missing."""
    settings = _settings(request)
    missing = missing_vendor_files(settings.api_web_vendor_dir)
    if missing:
        return _missing_page(settings.api_web_vendor_dir, missing)
    html = (STATIC_DIR / "index.html").read_bytes()
    return Response(
        html,
        media_type="text/html; charset=utf-8",
        headers={
            "Content-Security-Policy": content_security_policy(settings.api_map_tile_url),
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
            "Cache-Control": "no-cache",
        },
    )


@router.get("/map/config.json")
async def map_config(request: Request) -> Response:
    """What the page needs before it has an API key: the tile layer (or none) and the version."""
    settings = _settings(request)
    body: dict[str, Any] = {
        "tile_url": settings.api_map_tile_url or None,
        "tile_attribution": settings.api_map_tile_attribution if settings.api_map_tile_url else None,
        "version": __version__,
    }
    return OrjsonResponse(body, headers={"Cache-Control": "no-cache"})


@router.get("/map/alert-types.json")
async def alert_types() -> Response:
    """Every alert type with its declaration (`fleetfence.contracts.AlertMeta`): the page's label,
    tone and list detail, and the condition it opens or closes. Beside the page's config, outside
    /api/v1 where every operation needs a key: it describes the product, not the fleet, and the page
    reads it before it has a key."""
    body = {t.value: dataclasses.asdict(t.meta) for t in AlertType}
    return OrjsonResponse(body, headers={"Cache-Control": "no-cache"})
