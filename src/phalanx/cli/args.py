"""What the run subcommands (``phalanx status|logs|stop``) share: a parser whose errors are
one line (exit 2), and the run directory argument."""

from __future__ import annotations

import argparse
from pathlib import Path

from phalanx.errors import UsageError
from phalanx.status.view import is_run_dir


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog.removeprefix('phalanx ')}: {message}")


def add_run_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run_dir", help="The job's run directory on this node (printed by phalanx at start)."
    )


def run_directory(command: str, text: str) -> Path:
    """``text`` as a run directory; a ``UsageError`` naming it when it is not one."""
    run_dir = Path(text)
    if not is_run_dir(run_dir):
        raise UsageError(
            f"{command}: {text!r} is not a phalanx run directory (no launcher.json or "
            "events.jsonl); give the directory phalanx printed at start"
        )
    return run_dir
