"""`fleetfence loadtest` when a service of the pipeline it starts dies at start (issue #64 case 5):
its last lines on the terminal are the error, in full, naming the service, its exit code and
the reason from the service's log, and it exits non-zero. Here the admin API refuses its
settings (a map tile URL it cannot use): a real process failing for a real reason, whose
traceback also carries brackets (`[type=value_error, ...]`) that rich used to take for markup.

The pipeline runs on the session's servers as external endpoints, so nothing but its own services
is started or stopped.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from embedded.pipeline import log_tail, settings_env
from fleetfence.settings import Settings
from tests.loadtest.helpers import attached_settings

pytestmark = [pytest.mark.services, pytest.mark.slow]


def run_cli(argv: list[str], env: dict[str, str], timeout_s: float) -> tuple[int, str, str]:
    """Run a command to its end; past `timeout_s` interrupt it (SIGINT: its `finally` stops the
    services it started, which SIGKILL would leave running) and fail."""
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        pytest.fail(f"{argv[3:]} still running after {timeout_s}s:\n{out[-3000:]}\n{err[-3000:]}")
    return proc.returncode, out, err


def test_a_service_dying_at_start_ends_the_load_test_with_its_name_code_and_log(
    settings: Settings, tmp_path: Path
) -> None:
    s = attached_settings(settings, tmp_path)
    report = tmp_path / "report"
    # Only the API reads it; no COLUMNS: stderr is a pipe, where rich would wrap at 80 columns.
    env = settings_env(s, FLEETFENCE_API_MAP_TILE_URL="tiles.example/{z}/{x}/{y}.png")
    env.pop("COLUMNS", None)
    argv = [sys.executable, "-m", "cli", "loadtest", "--vehicles", "5", "--duration-s", "10"]
    argv += ["--gateways", "1", "--report-dir", str(report)]
    code, _out, err = run_cli(argv, env, timeout_s=300)

    assert code == 2, err[-6000:]
    log = report / "logs" / "api.log"
    tail = log_tail(log)
    assert tail, f"{log} is empty"
    # The error is the last thing printed, whole: its first line names the service, its exit
    # code and its log; then the log's last lines, each on a line of its own, exactly as logged.
    lines = err.rstrip("\n").split("\n")
    (first,) = [i for i, line in enumerate(lines) if line.startswith("error: api exited with code 1; ")]
    assert lines[first].endswith(f"the last {len(tail)} lines of its log {log}:"), lines[first]
    assert lines[first + 1 :] == [f"  {line}" for line in tail], err[-6000:]
    shown = "\n".join(lines[first:])
    assert "api_map_tile_url" in shown
    assert "must be an http(s) URL" in shown
    assert "[type=value_error," in shown  # not taken for rich markup
