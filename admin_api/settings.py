"""Settings of the admin API (FLEETFENCE_API_*), on top of the vehicle master's."""

from __future__ import annotations

from pydantic import Field

from fleetfence.settings import Settings
from vehicle_master.settings import MasterSettings


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
    api_sse_heartbeat_s: float = Field(default=15.0, gt=0, description="SSE keep-alive comment interval.")


def api_settings(base: Settings, **overrides: object) -> ApiSettings:
    """ApiSettings from already-built base settings (tests build those from fixtures)."""
    values = {name: getattr(base, name) for name in Settings.model_fields}
    values.update(overrides)
    return ApiSettings.model_validate(values)
