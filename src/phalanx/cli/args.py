"""What the run subcommands (``phalanx status|logs|stacks|timeline|stop``) share: a parser
whose errors are one line (exit 2), and the run argument (``phalanx.cli.runs``)."""

from __future__ import annotations

import argparse

from phalanx.cli.runs import run_directory
from phalanx.errors import UsageError

__all__ = ["Parser", "add_run_dir", "run_directory"]


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog.removeprefix('phalanx ')}: {message}")


def add_run_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run_dir",
        metavar="RUN",
        help="The run: its directory (printed by phalanx at start), or its name as 'phalanx "
        "ls' lists it, a unique prefix of the name, or 'last' (the newest run).",
    )
