#!/usr/bin/env python3
"""Container health checks for the FleetFence images (stdlib only; installed as fleetfence-healthcheck).

    fleetfence-healthcheck http URL [--contains TEXT]   # 2xx, and TEXT in the body if given
    fleetfence-healthcheck spark-worker MASTER_UI HOST   # HOST is an ALIVE worker of the master

Exit 0 when healthy, 1 otherwise (with the reason on stderr), as Docker's HEALTHCHECK expects.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request


def _get(url: str, timeout_s: float) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        if not 200 <= resp.status < 300:
            raise RuntimeError(f"{url} answered {resp.status}")
        return str(resp.read().decode("utf-8", errors="replace"))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="fleetfence-healthcheck")
    parser.add_argument("--timeout-s", type=float, default=4.0)
    sub = parser.add_subparsers(dest="mode", required=True)
    http = sub.add_parser("http")
    http.add_argument("url")
    http.add_argument("--contains", default=None)
    worker = sub.add_parser("spark-worker")
    worker.add_argument("master_ui", help="e.g. http://spark-master:8080")
    worker.add_argument("host", help="the worker's --host")
    args = parser.parse_args(argv)
    try:
        if args.mode == "http":
            body = _get(args.url, args.timeout_s)
            if args.contains is not None and args.contains not in body:
                raise RuntimeError(f"{args.url}: {args.contains!r} not in the response")
        else:
            state = json.loads(_get(args.master_ui.rstrip("/") + "/json/", args.timeout_s))
            alive = [w for w in state.get("workers", []) if w.get("state") == "ALIVE"]
            if not any(w.get("host") == args.host for w in alive):
                raise RuntimeError(f"worker {args.host} is not registered ALIVE with {args.master_ui}")
    except Exception as exc:
        print(f"unhealthy: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
