"""Settings of the admin API (FLEETFENCE_API_*), on top of the vehicle master's."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from vehicle_master.settings import MasterSettings

# The repo's `npm ci --prefix web` target; images and installs elsewhere set FLEETFENCE_API_WEB_VENDOR_DIR.
DEFAULT_WEB_VENDOR_DIR = Path(__file__).resolve().parent.parent / "web" / "node_modules"


class ApiSettings(MasterSettings):
    api_host: str = Field(default="127.0.0.1", description="Address the admin API listens on.")
    api_port: int = Field(default=8000, ge=1, le=65535)
    api_workers: int = Field(default=1, ge=1, le=64, description="uvicorn worker processes.")
    api_cors_origins: list[str] = Field(
        default_factory=list, description='Allowed CORS origins, JSON list, e.g. ["https://ops.example"].'
    )
    api_max_body_bytes: int = Field(default=5 * 1024 * 1024, ge=1024, description="Larger requests get 413.")
    api_run_relay: bool = Field(default=True, description="Run the outbox relay inside the API process.")
    api_key_cache_s: float = Field(
        default=5.0, ge=0, description="How long a verified API key is trusted without asking Redis."
    )
    api_redis_retry_after_s: int = Field(
        default=1,
        ge=1,
        le=3600,
        description="Retry-After of the 503 a request gets while Redis is down or restarting.",
    )
    api_sse_heartbeat_s: float = Field(default=15.0, gt=0, description="SSE keep-alive comment interval.")
    api_stream_token_ttl_s: int = Field(
        default=60,
        ge=5,
        le=3600,
        description="Lifetime of a stream token (EventSource cannot send X-API-Key; the map asks for one).",
    )
    api_web_vendor_dir: Path = Field(
        default=DEFAULT_WEB_VENDOR_DIR,
        description="node_modules of web/package.json (Leaflet, Geoman), served at /static/vendor.",
    )
    api_map_tile_url: str = Field(
        default="",
        max_length=500,
        description="XYZ tile URL for the map, e.g. https://tile.openstreetmap.org/{z}/{x}/{y}.png; "
        "empty draws a plain lat/lon grid and the page makes no external request.",
    )
    api_map_tile_attribution: str = Field(
        default="&copy; OpenStreetMap contributors",
        max_length=500,
        description="Attribution shown with the tiles of api_map_tile_url.",
    )

    @field_validator("api_map_tile_url")
    @classmethod
    def _tile_url(cls, v: str) -> str:
        """Fail at start-up, not with a blank map: the page can only use an http(s) XYZ template."""
        v = v.strip()
        placeholders = all(p in v for p in ("{z}", "{x}", "{y}"))
        if v and (not v.startswith(("https://", "http://")) or not placeholders):
            raise ValueError(f"must be an http(s) URL with {{z}}, {{x}} and {{y}}, got {v[:80]!r}")
        return v
