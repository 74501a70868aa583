"""`fleetfence alerts tail`: a live terminal view of committed alerts, or JSON lines for scripts.

The tail is a viewer, not a durable subscriber: by default it uses a throw-away consumer group
that starts at the end of the topic and commits nothing, so it never disturbs another receiver and
never leaves offsets behind. `--group` makes it a durable subscriber instead.
"""

from __future__ import annotations

import sys
import threading
from typing import TextIO

from rich.console import Console
from rich.text import Text

from alerts.errors import StopRequestedError
from alerts.model import Alert, summary
from alerts.sink import Context, Outcome


def render(alert: Alert) -> Text:
    """A readable line: the type coloured by severity, the rest plain so it greps well."""
    line = summary(alert)
    text = Text(line)
    start = line.find(alert.type.value)
    text.stylize(alert.type.meta.style, start, start + len(alert.type.value))
    vstart = line.find(alert.vehicle_id, start + len(alert.type.value))
    text.stylize("bold", vstart, vstart + len(alert.vehicle_id))
    return text


class TailSink:
    idempotent = False

    def __init__(self, as_json: bool, limit: int | None = None, out: TextIO | None = None) -> None:
        self.as_json = as_json
        self.limit = limit
        self.count = 0
        self.done = threading.Event()
        self._out = out or sys.stdout
        self._console = Console(file=self._out, highlight=False, soft_wrap=True)

    def deliver(self, alert: Alert, ctx: Context) -> Outcome:
        if self.limit is not None and self.count >= self.limit:
            # Past the limit nothing is shown; the runner is being stopped by the caller.
            self.done.set()
            ctx.stopping.set()
            raise StopRequestedError("tail limit reached")
        if self.as_json:
            self._out.write(alert.raw.decode("utf-8") + "\n")
            self._out.flush()
        else:
            self._console.print(render(alert))
        self.count += 1
        if self.limit is not None and self.count >= self.limit:
            self.done.set()
        return Outcome.DELIVERED

    def close(self) -> None:
        self._out.flush()
