"""Structured logging for services: one line per event, UTC timestamps, key=value or JSON.

Services log with `logger.info("what happened key=%s", value)`; this module only decides the line
format, so library code never configures logging itself.
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime

import orjson


class _UtcFormatter(logging.Formatter):
    def __init__(self, as_json: bool) -> None:
        super().__init__()
        self.as_json = as_json

    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
        msg = record.getMessage()
        if record.exc_info:
            msg = f"{msg}\n{self.formatException(record.exc_info)}"
        if self.as_json:
            return orjson.dumps(
                {"ts": ts, "level": record.levelname, "logger": record.name, "msg": msg}
            ).decode()
        return f"ts={ts} level={record.levelname} logger={record.name} msg={msg}"


def configure_logging(level: str = "INFO", as_json: bool = False) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_UtcFormatter(as_json))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("py4j", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
