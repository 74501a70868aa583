"""The load test's test helpers: the command line, and real worker processes a test can make burn
CPU, hold memory and spawn children of their own."""

from __future__ import annotations

import select
import subprocess
import sys
from pathlib import Path
from typing import IO

from fleetfence.mqtt import account_fields
from fleetfence.settings import Settings

FLEETFENCE = [sys.executable, "-m", "cli"]


def attached_settings(settings: Settings, tmp_path: Path) -> Settings:
    """Settings of an installation on the session's servers, external to it (a pipeline started
    with them starts no server and stops none), with its own state, Redis prefix and accounts."""
    return settings.model_copy(
        update={
            "state_dir": tmp_path / "state",
            "kafka_bootstrap": settings.bootstrap_servers,
            "mqtt_url": "mqtt://{}:{}".format(*settings.mqtt_host_port),
            "redis_url": settings.redis_dsn,
            "redis_prefix": f"{settings.topic_prefix}ff:",
            **account_fields(settings),
        }
    )


# An area empty for the installations the attach tests start (Hamburg; the default is Berlin's).
ELSEWHERE = "9.90,53.52,10.10,53.60"

# A worker answers one line per command on stdin: "burn S" (S seconds of CPU, at most 15 s of wall
# time), "alloc N" (N MiB held and touched), "spawn" (a child worker, its pid answered), "child ..."
# (a command passed to that child, its answer relayed), "reap" (the child stopped and waited for).
# End of input ends it.
WORKER = """\
import subprocess, sys, time

held = []
child = None
print("ready", flush=True)
for line in sys.stdin:
    cmd, *args = line.split()
    if cmd == "burn":
        end_cpu, end_wall = time.process_time() + float(args[0]), time.monotonic() + 15
        while time.process_time() < end_cpu and time.monotonic() < end_wall:
            pass
        print("done", flush=True)
    elif cmd == "alloc":
        held.append(b"\\x01" * (int(args[0]) * 1024 * 1024))
        print("allocated", flush=True)
    elif cmd == "spawn":
        child = subprocess.Popen(
            [sys.executable, sys.argv[0]], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        child.stdout.readline()
        print(child.pid, flush=True)
    elif cmd == "child":
        child.stdin.write(" ".join(args) + "\\n")
        child.stdin.flush()
        print(child.stdout.readline().strip(), flush=True)
    elif cmd == "reap":
        child.stdin.close()
        child.wait()
        print("reaped", flush=True)
"""


class Worker:
    """One worker process, ready (it has printed "ready") when constructed."""

    def __init__(self, script: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.reply() == "ready"

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def _stdin(self) -> IO[str]:
        assert self.proc.stdin is not None
        return self.proc.stdin

    @property
    def _stdout(self) -> IO[str]:
        assert self.proc.stdout is not None
        return self.proc.stdout

    def send(self, command: str) -> None:
        self._stdin.write(command + "\n")
        self._stdin.flush()

    def reply(self) -> str:
        return self._stdout.readline().strip()

    def ask(self, command: str) -> str:
        self.send(command)
        return self.reply()

    def replied(self) -> bool:
        """Whether an answer is waiting (the worker finished its command), without blocking."""
        return bool(select.select([self._stdout], [], [], 0)[0])

    def close(self) -> None:
        """End its input: it exits (a zombie until `wait`), its child with it."""
        self._stdin.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None and not pipe.closed:
                pipe.close()
