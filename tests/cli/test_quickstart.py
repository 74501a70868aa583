"""docs/quickstart.md, run exactly as written: every ```bash block, in order, in one bash process.

The document is the test's script, so it cannot drift from what works. The only things the test
adds come before the document's first command: a working folder of its own (holding a `.venv`
link to the repository's, so `source .venv/bin/activate` works as in a checkout, and the default
state folder `.fleetfence` ends up in that folder), and environment variables that move every
port to a free one (the document reads the same variables, with the defaults as fall-back). Each
block must finish before its deadline; meanwhile the services the document started in the
background are watched, so one that dies fails the test at once, with its log. Whatever happens,
everything the document started is stopped at the end, and the test checks that nothing was left
running.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import redis

from fleetfence.readmodels import ReadKeys
from fleetfence.settings import Settings
from fleetfence.testing import wait_for

pytestmark = [pytest.mark.spark, pytest.mark.services, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "quickstart.md"
BASH_BLOCK = re.compile(r"^```bash\n(.*?)^```\s*$", re.DOTALL | re.MULTILINE)
BLOCK_TIMEOUT_S = 150.0  # the longest block waits for Spark's first micro-batch (curl retries 90 s)
LOG_DIR = Path(".fleetfence") / "quickstart"  # where the document's services write logs and pids


def bash_blocks(markdown: str) -> list[str]:
    return [m.group(1) for m in BASH_BLOCK.finditer(markdown)]


def _alive(pid: int) -> bool:
    """Running and not a zombie (a dead child of the doc's shell stays one until bash reaps it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            out.append(int(entry.name))
    return out


def _pids_with_cwd_under(folder: Path) -> list[int]:
    """Processes whose working directory is inside `folder`: everything the document started
    (services, the embedded servers, Spark's JVM) inherited the shell's, ours alone."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cwd = Path(os.readlink(entry / "cwd"))
        except OSError:
            continue
        if (cwd == folder or folder in cwd.parents) and _alive(int(entry.name)):
            out.append(int(entry.name))
    return out


def _kill_and_wait(pids: list[int], timeout_s: float = 20.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + timeout_s
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not any(_alive(p) for p in pids):
            return


class DocShell:
    """One `bash` process that runs the document's blocks one after another (shared variables,
    functions and background jobs, as in a terminal), under `set -eo pipefail`."""

    def __init__(self, work: Path, env: dict[str, str], scripts: Path) -> None:
        self.work, self.env, self.scripts = work, env, scripts
        self.proc = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            cwd=work,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own process group: the background services included
        )
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, name="quickstart-bash", daemon=True)
        self._reader.start()
        self._send("set -eo pipefail\n")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._lock:
                self.lines.append(line.rstrip("\n"))

    def _send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text)
        self.proc.stdin.flush()

    def output(self, start: int = 0) -> list[str]:
        with self._lock:
            return self.lines[start:]

    def run_block(self, n: int, block: str, watch_services: bool) -> str:
        """Run one block (stdin /dev/null, as typed at a prompt); its output once it finished."""
        script = self.scripts / f"block-{n:02d}.sh"
        script.write_text(block)
        marker = f"@@quickstart block {n} done@@"
        start = len(self.output())
        self._send(f"source {script} </dev/null\necho '{marker}'\n")

        def finished() -> bool:
            out = self.output(start)
            if marker in out:
                return True
            if self.proc.poll() is not None:
                self._reader.join(5)
                raise AssertionError(
                    f"block {n} failed (bash exited with {self.proc.returncode}):\n{block}\n"
                    f"--- output ---\n" + "\n".join(self.output(start)) + self.service_logs()
                )
            if watch_services:
                self.check_services(n, block)
            return False

        try:
            wait_for(finished, BLOCK_TIMEOUT_S, f"block {n} of docs/quickstart.md to finish", interval_s=0.2)
        except AssertionError as exc:
            if "timed out" in str(exc):
                raise AssertionError(
                    f"{exc}\n{block}\n--- output ---\n" + "\n".join(self.output(start)) + self.service_logs()
                ) from None
            raise
        out = self.output(start)
        return "\n".join(out[: out.index(marker)])

    def service_pids(self) -> list[int]:
        f = self.work / LOG_DIR / "pids"
        return [int(p) for p in f.read_text().split()] if f.exists() else []

    def check_services(self, n: int, block: str) -> None:
        dead = [p for p in self.service_pids() if not _alive(p)]
        if dead:
            raise AssertionError(
                f"a service of docs/quickstart.md exited (pid {dead}) during block {n}:\n{block}\n"
                "--- output ---\n" + "\n".join(self.output()[-40:]) + self.service_logs()
            )

    def service_logs(self) -> str:
        parts = []
        for log in sorted((self.work / LOG_DIR).glob("*.log")):
            parts.append(f"\n--- {log.name} (end) ---\n{log.read_text(errors='replace')[-3000:]}")
        return "".join(parts)

    def finish(self, timeout_s: float = 10.0) -> int | None:
        """EOF after the last block: bash exits (its background jobs, if any, would stay)."""
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            except OSError:
                pass
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout_s)
        return self.proc.poll()

    def close(self, timeout_s: float = 60.0) -> None:
        """End the shell and stop its whole process group (the services, on a failure)."""
        self.finish(5)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                self.proc.poll()  # reap bash itself
                if not _group_members(self.proc.pid):
                    break
                time.sleep(0.1)
        if self.proc.poll() is None:
            self.proc.wait(10)
        self._reader.join(5)


def _wait_for_history(env: dict[str, str], vehicle_id: str) -> None:
    r = redis.Redis(host="127.0.0.1", port=int(env["FLEETFENCE_REDIS_PORT"]))
    try:
        keys = ReadKeys(Settings.model_fields["redis_prefix"].default)
        wait_for(
            lambda: r.zcard(keys.alerts_vehicle(vehicle_id)),
            30,
            f"the history receiver to store the alert of {vehicle_id}",
            interval_s=0.1,
        )
    finally:
        r.close()


def test_quickstart_runs_as_written(doc_env: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    work, env = doc_env
    blocks = bash_blocks(DOC.read_text())
    assert len(blocks) >= 10, f"expected the quickstart's bash blocks, found {len(blocks)}"
    scripts = tmp_path / "blocks"
    scripts.mkdir()
    outputs: dict[int, str] = {}
    shell = DocShell(work, env, scripts)
    leftovers: list[int] = []
    try:
        for n, block in enumerate(blocks):
            if "/api/v1/alerts?" in block:
                # A reader looks at the alert before typing on; the test gives the history
                # receiver that moment by waiting until it has stored the alert the block reads.
                _wait_for_history(env, "truck-042")
            stopping = "infra down" in block
            outputs[n] = shell.run_block(n, block, watch_services=not stopping)
        assert shell.finish() == 0, "\n".join(shell.output()[-40:])
        # The document's own stop block stopped everything: nothing it started still runs.
        leftovers = _pids_with_cwd_under(work)
        assert not leftovers, f"still running after the quickstart's stop block: {leftovers}"
        assert not any((work / ".fleetfence" / "run").glob("*.pid")), "infra pid files left behind"
    finally:
        shell.close()
        _kill_and_wait(_pids_with_cwd_under(work))

    # Shown by pytest on a failure (and with -s): each block and what it printed.
    print("\n".join(f"$ {blocks[n]}{out}\n" for n, out in outputs.items()))

    def output_of(snippet: str) -> str:
        found = [outputs[n] for n, b in enumerate(blocks) if snippet in b]
        assert found, f"no bash block of docs/quickstart.md contains {snippet!r}"
        return found[-1]

    up = output_of("fleetfence infra up")
    assert "healthy" in up
    assert "Connection refused" not in up, up  # the doc promises a clean table
    assert '"ready":true' in output_of("/readyz")
    on_route = output_of("--retry-all-errors")
    assert '"status":"on_route"' in on_route, on_route
    assert '"route_id":"r-berlin-1"' in on_route, on_route
    # The alert on screen: `fleetfence alerts tail` printed the deviation at the third fix outside.
    tail = output_of("fleetfence alerts tail")
    assert re.search(r"ROUTE_DEVIATION\s+truck-042 route=r-berlin-1 seq=6\b", tail), tail
    assert "level=INFO" not in tail, tail  # only the alert, no receiver log lines around it
    # The live state and the history the document reads afterwards.
    after = output_of("/api/v1/alerts?vehicle_id=truck-042")
    assert '"status":"off_route"' in after, after
    assert '"type":"ROUTE_DEVIATION"' in after, after
