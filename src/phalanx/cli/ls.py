"""``phalanx ls [--log-dir DIR]``: this user's recent runs, newest first.

Runs are the run directories under the default log base (``rundir.default_log_base()``,
where runs go without ``--log-dir``) or under ``DIR``. For each: its id (the directory's
name), its state (``running`` while its agent is alive; otherwise the job's outcome from
its status or events, or ``ended`` when the agent ended without one, e.g. SIGKILL), when it
started and how long it ran (so far).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from phalanx.cli.args import Parser
from phalanx.errors import UsageError
from phalanx.rundir import default_log_base
from phalanx.status.view import RunView, gather, is_run_dir

MOST = 50  # runs listed at most (the newest)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = Parser(prog="phalanx ls", description="List this user's recent runs, newest first.")
    parser.add_argument(
        "--log-dir",
        type=Path,
        help=f"Where the runs are (default: {default_log_base()}, as phalanx's own default).",
    )
    parser.add_argument(
        "--all", action="store_true", help=f"Every run, not only the {MOST} newest."
    )
    return parser.parse_args(argv)


def _row(view: RunView, now: float) -> tuple[float, list[str]]:
    head = view.own
    started = head.get("started_at")
    if not isinstance(started, (int, float)):
        started = view.run_dir.stat().st_mtime
    ended = head.get("ended_at")
    span = (ended if isinstance(ended, (int, float)) and not view.alive else now) - started
    minutes, seconds = divmod(max(0, int(span)), 60)
    hours, minutes = divmod(minutes, 60)
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started))
    return started, [view.run_dir.name, view.state, when, f"{hours}:{minutes:02d}:{seconds:02d}"]


def main(argv: list[str]) -> int:
    args = parse(argv)
    base = args.log_dir or default_log_base()
    if args.log_dir is not None and not base.is_dir():
        raise UsageError(f"ls: --log-dir {str(base)!r} is not a directory")
    runs = [p for p in base.iterdir() if p.is_dir() and is_run_dir(p)] if base.is_dir() else []
    if not runs:
        print(f"phalanx: no runs under {base}", file=sys.stderr)
        return 0
    now = time.time()
    # No request to the agents: a list is read from the files (status.json is ~2 s fresh).
    rows = sorted((_row(gather(p, 0, ask_agent=False), now) for p in runs), reverse=True)
    shown = rows if args.all else rows[:MOST]
    table = [["RUN", "STATE", "STARTED", "DURATION"], *[cells for _, cells in shown]]
    widths = [max(len(r[i]) for r in table) for i in range(4)]
    for cells in table:
        print("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip())
    return 0
