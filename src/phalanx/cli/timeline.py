"""``phalanx timeline RUN_DIR [-o run.html]``: the run's events as a page of lanes per rank
(``-o``), or as a few lines on the terminal. Works on a running job too (what happened so
far) and on a finished one."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from phalanx.cli.args import Parser, add_run_dir, run_directory
from phalanx.errors import PhalanxError, UsageError
from phalanx.events import EVENTS_FILE, read_run_events
from phalanx.timeline import build, render, summarize


def parse(argv: list[str]) -> argparse.Namespace:
    parser = Parser(
        prog="phalanx timeline",
        description=(
            "Draw a run's events: one lane per rank over time, grouped by node (attempts, "
            "rendezvous waits, failures with their kind, hangs, restarts, the step reached). "
            "With -o, a self-contained HTML page (nothing is fetched when it is viewed; hover "
            "a mark for its details); without, a summary on the terminal."
        ),
    )
    add_run_dir(parser)
    parser.add_argument("-o", "--output", help="Write the HTML page here.")
    return parser.parse_args(argv)


def run_events(run_dir: Path) -> list[dict[str, Any]]:
    """The run's events: this node's, and the other nodes' that ``phalanx status`` gathered
    here (``read_run_events``)."""
    path = run_dir / EVENTS_FILE
    try:
        path.open("rb").close()  # this node's file: missing or unreadable is said here
    except FileNotFoundError:
        raise UsageError(
            f"timeline: {str(run_dir)!r} has no {EVENTS_FILE} (yet); 'phalanx ls' lists the runs"
        ) from None
    except OSError as exc:
        raise PhalanxError(f"timeline: cannot read {path} ({exc.strerror or exc})") from None
    return read_run_events(run_dir)


def main(argv: list[str]) -> int:
    args = parse(argv)
    timeline = build(run_events(run_directory("timeline", args.run_dir)))
    if args.output is None:
        print(summarize(timeline))
        return 0
    try:
        Path(args.output).write_text(render(timeline), encoding="utf-8")
    except OSError as exc:
        raise UsageError(
            f"timeline: cannot write {args.output!r} ({exc.strerror or exc})"
        ) from None
    print(f"phalanx: timeline written to {args.output}", file=sys.stderr)
    return 0
