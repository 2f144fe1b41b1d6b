"""``phalanx logs RUN_DIR [--rank R] [--follow]``: the workers' output on this node.

Each rank's output is in ``RUN_DIR/attempt_<restart>/rank_<rank>/{stdout,stderr}.log``
(the supervisor's log files, whatever ``--redirects`` sent to the console); this prints
them in order of attempt, rank and stream, each under a ``==> FILE <==`` header as ``tail``
does with several files. ``--follow`` then prints what is added, as ``tail -f``, new
attempts' files included, until the run's agent ends.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path
from typing import BinaryIO

from phalanx.cli.args import Parser, add_run_dir, run_directory
from phalanx.errors import UsageError
from phalanx.status.launcher import read_launcher

_LOG = re.compile(r"^attempt_(\d+)/rank_(\d+)/(stdout|stderr)\.log$")
FOLLOW_EVERY = 0.5  # seconds between looks at the files


def parse(argv: list[str]) -> argparse.Namespace:
    parser = Parser(
        prog="phalanx logs",
        description="Print the workers' log files of a run on this node, by attempt and rank.",
    )
    add_run_dir(parser)
    parser.add_argument("--rank", type=_rank, help="Only this global rank's files.")
    parser.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="Keep printing what is added until the run ends.",
    )
    return parser.parse_args(argv)


def _rank(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a rank (0, 1, ...), got {text!r}")
    return int(text)


def log_files(run_dir: Path, rank: int | None) -> list[Path]:
    """The run's log files (of ``rank`` only, when given) by attempt, rank, stdout first."""
    found = []
    for path in run_dir.glob("attempt_*/rank_*/*.log"):
        match = _LOG.match(path.relative_to(run_dir).as_posix())
        if match and (rank is None or int(match.group(2)) == rank):
            attempt, r, stream = match.groups()
            found.append(((int(attempt), int(r), stream != "stdout"), path))
    return [path for _, path in sorted(found)]


class _Printer:
    """Prints what is new in each file, with a header whenever the file changes."""

    def __init__(self, run_dir: Path, out: BinaryIO) -> None:
        self._run_dir = run_dir
        self._out = out
        self._offsets: dict[Path, int] = {}
        self._last: Path | None = None

    def print_new(self, paths: list[Path]) -> None:
        for path in paths:
            offset = self._offsets.get(path, 0)
            try:
                with open(path, "rb") as handle:
                    handle.seek(offset)
                    data = handle.read()
            except OSError:
                continue
            if not data and path in self._offsets:
                continue
            self._offsets[path] = offset + len(data)
            if self._last != path:
                gap = b"\n" if self._last is not None else b""
                name = path.relative_to(self._run_dir).as_posix()
                self._out.write(gap + f"==> {name} <==\n".encode())
                self._last = path
            self._out.write(data)
        self._out.flush()


def main(argv: list[str]) -> int:
    args = parse(argv)
    run_dir = run_directory("logs", args.run_dir)
    printer = _Printer(run_dir, sys.stdout.buffer)
    paths = log_files(run_dir, args.rank)
    if not paths and not args.follow:
        what = f"of rank {args.rank} " if args.rank is not None else ""
        ranks = sorted({int(p.parent.name.removeprefix("rank_")) for p in log_files(run_dir, None)})
        there = f" (ranks there: {', '.join(map(str, ranks))})" if ranks else ""
        raise UsageError(f"logs: no log files {what}in {str(run_dir)!r}{there}")
    printer.print_new(paths)
    if args.follow:
        agent = read_launcher(run_dir)
        while agent is not None and agent.alive():
            time.sleep(FOLLOW_EVERY)
            printer.print_new(log_files(run_dir, args.rank))
        printer.print_new(log_files(run_dir, args.rank))  # what the last moments wrote
    return 0
