"""``phalanx ls [--log-dir DIR]``: this user's recent runs, newest first.

Runs are the run directories under the default log base (``rundir.default_log_base()``,
where runs go without ``--log-dir``) or under ``DIR``. For each: its id (the directory's
name), its state (``running`` while its agent is alive; otherwise the job's outcome from
its status or events, or ``ended`` when the agent ended without one, e.g. SIGKILL), when it
started and how long it ran (so far). Where the runs are is said on stderr, with how to
name one to the other subcommands (``phalanx.cli.runs``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from phalanx.cli.args import Parser
from phalanx.cli.runs import LAST, listed, started_at
from phalanx.errors import UsageError
from phalanx.resources.rundir import default_log_base
from phalanx.status.view import RunView

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


def _row(view: RunView, now: float) -> list[str]:
    head = view.own
    started = started_at(view)
    ended = head.get("ended_at")
    span = (ended if isinstance(ended, (int, float)) and not view.alive else now) - started
    minutes, seconds = divmod(max(0, int(span)), 60)
    hours, minutes = divmod(minutes, 60)
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started))
    return [view.run_dir.name, view.state, when, f"{hours}:{minutes:02d}:{seconds:02d}"]


def main(argv: list[str]) -> int:
    args = parse(argv)
    base = args.log_dir or default_log_base()
    if args.log_dir is not None and not base.is_dir():
        raise UsageError(f"ls: --log-dir {str(base)!r} is not a directory")
    views = listed(base)
    if not views:
        print(f"phalanx: no runs under {base}", file=sys.stderr)
        return 0
    now = time.time()
    shown = views if args.all else views[:MOST]
    table = [["RUN", "STATE", "STARTED", "DURATION"], *[_row(view, now) for view in shown]]
    widths = [max(len(r[i]) for r in table) for i in range(4)]
    for cells in table:
        print("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip())
    if args.log_dir is None:
        how = f"name one (or a unique prefix, or '{LAST}') to phalanx status, logs, stacks, timeline, stop"
    else:
        how = "give status, logs, stacks, timeline, stop the run's directory there"
    print(f"phalanx: {len(views)} run(s) in {base}; {how}", file=sys.stderr)
    return 0
