"""``phalanx clean (--keep N | --older-than AGE) [--dry-run] [--log-dir DIR]``: remove old
run directories, which phalanx otherwise keeps forever.

The runs are those ``phalanx ls`` lists (the default log base, or ``DIR``), newest first.
``--keep N`` keeps the N newest; ``--older-than AGE`` removes only runs whose last write
(``events.jsonl``, else the directory) is older than AGE; with both, a run goes when both
say so. A running job's directory is never removed (its agent is alive), nor one whose
agent runs on another host (this host cannot tell whether it still runs). ``--dry-run``
prints what would go.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import time
from pathlib import Path

from phalanx.cli.args import Parser
from phalanx.cli.runs import listed
from phalanx.errors import PhalanxError, UsageError
from phalanx.events.log import EVENTS_FILE
from phalanx.resources.rundir import default_log_base
from phalanx.status.launcher import read_launcher
from phalanx.status.view import RunView

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def age_seconds(text: str) -> float:
    """``30s``, ``90m``, ``12h``, ``7d``, ``2w`` (or bare seconds) -> seconds."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text)
    if found is None:
        raise argparse.ArgumentTypeError(
            f"expected an age such as 7d, 12h, 30m or 90s, got {text!r}"
        )
    return float(found[1]) * _UNITS[found[2] or "s"]


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a count >= 0, got {text!r}")
    return int(text)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = Parser(
        prog="phalanx clean",
        description=(
            "Remove old run directories (phalanx keeps them until you do): all but the N "
            "newest, or those older than an age. A running job's directory is never removed."
        ),
    )
    parser.add_argument("--keep", type=_count, metavar="N", help="Keep the N newest runs.")
    parser.add_argument(
        "--older-than",
        type=age_seconds,
        metavar="AGE",
        help="Remove runs last written more than AGE ago: 7d, 12h, 30m, 90s.",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="Print what would be removed; remove nothing."
    )
    parser.add_argument(
        "--log-dir",
        type=Path,
        help=f"Where the runs are (default: {default_log_base()}, as phalanx ls).",
    )
    args = parser.parse_args(argv)
    if args.keep is None and args.older_than is None:
        raise UsageError("clean: give --keep N or --older-than AGE (e.g. 7d); nothing was removed")
    return args


def _last_write(run_dir: Path) -> float:
    events = run_dir / EVENTS_FILE
    return (events if events.is_file() else run_dir).stat().st_mtime


def _busy(view: RunView) -> str:
    """Why this run must stay, or '' when it may go."""
    if view.alive:
        return "running"
    agent = read_launcher(view.run_dir)
    if agent is not None and not agent.here:
        return f"its agent ran on {agent.host}; remove it there"
    return ""


def main(argv: list[str]) -> int:
    args = parse(argv)
    base = args.log_dir or default_log_base()
    if args.log_dir is not None and not base.is_dir():
        raise UsageError(f"clean: --log-dir {str(base)!r} is not a directory")
    views = listed(base)
    now = time.time()
    verb = "would remove" if args.dry_run else "removed"
    removed, kept, failed = 0, 0, []
    for index, view in enumerate(views):
        old = args.older_than is None or now - _last_write(view.run_dir) > args.older_than
        if (args.keep is not None and index < args.keep) or not old:
            kept += 1
            continue
        why = _busy(view)
        if why:
            print(f"phalanx: kept {view.run_dir.name} ({why})", file=sys.stderr)
            kept += 1
            continue
        if not args.dry_run:
            try:
                shutil.rmtree(view.run_dir)
            except OSError as exc:
                failed.append(f"{view.run_dir.name} ({exc.strerror or exc})")
                continue
        print(f"phalanx: {verb} {view.run_dir}", file=sys.stderr)
        removed += 1
    print(f"phalanx: {verb} {removed} run(s), kept {kept}, in {base}", file=sys.stderr)
    if failed:
        raise PhalanxError(f"clean: could not remove {len(failed)}: {'; '.join(failed)}")
    return 0
