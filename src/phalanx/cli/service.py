"""``phalanx service status|stop``: this user's warm services (``--keep-warm``).

``status`` lists each live service: pid, key, jobs and workers it serves now, for how long
it has been idle and how long it stays idle before it ends, its preload list and python.
``stop`` asks each to end: it stops accepting launches at once (the next launch starts a new
one) and ends when the jobs it serves have ended; their workers are not touched. Both exit 0,
also when no service runs (said on stderr).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from phalanx.cli.args import Parser
from phalanx.errors import UsageError
from phalanx.service.client import ask_all
from phalanx.service.paths import UnsafeDirectory, service_dir

HEADER = ["PID", "KEY", "JOBS", "WORKERS", "IDLE", "ENDS AFTER", "PRELOAD", "PYTHON"]


def parse(argv: list[str]) -> argparse.Namespace:
    parser = Parser(
        prog="phalanx service",
        description="See or stop this user's warm services (started by launches with "
        "--keep-warm). 'stop' ends each once the jobs it serves have ended.",
    )
    parser.add_argument("action", choices=("status", "stop"), help="What to do.")
    return parser.parse_args(argv)


def _row(answer: dict[str, object]) -> list[str]:
    preload = answer.get("preload")
    modules = ["torch", *(str(m) for m in preload)] if isinstance(preload, list) else ["torch"]
    idle = "serving" if answer.get("jobs") else f"{answer.get('idle_for', 0)} s"
    ends = "stopping" if answer.get("stopping") else f"{answer.get('idle', 0)} s idle"
    return [
        str(answer.get("pid")), str(answer.get("key")), str(answer.get("jobs")),
        str(answer.get("workers")), idle, ends,
        ",".join(modules), str(answer.get("python")),
    ]  # fmt: skip


def main(argv: list[str]) -> int:
    args = parse(argv)
    try:
        where = service_dir(os.environ)
    except (OSError, UnsafeDirectory) as exc:
        raise UsageError(f"service: no usable directory for warm services: {exc}") from None
    answers = ask_all(os.environ, {args.action: 1})
    if not answers:
        print(f"phalanx: no warm service runs (sockets in {where})", file=sys.stderr)
        return 0
    if args.action == "stop":
        for answer in answers:
            jobs = int(answer.get("jobs", 0))
            after = f" after its {jobs} job(s) end" if jobs else ""
            print(f"service pid {answer.get('stopping')}: stopping{after}")
        return 0
    rows = [HEADER, *(_row(a) for a in answers)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER) - 1)]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)), row[-1])
    print(f"(sockets in {where}; as of {time.strftime('%H:%M:%S')})", file=sys.stderr)
    return 0
