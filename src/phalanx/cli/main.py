"""``phalanx`` / ``python -m phalanx``: parse, plan, run; map errors to exit codes."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from importlib import import_module
from pathlib import Path
from typing import NoReturn

from phalanx.cli.usage import SUBCOMMAND_NAMES, did_you_mean
from phalanx.errors import Interrupted, JobFailed, PhalanxError, UsageError, stopped_line
from phalanx.supervisor.console import configure_logging, settle
from phalanx.worker.leave import exit_launcher

log = logging.getLogger("phalanx")


def _subcommand(name: str) -> Callable[[list[str]], int]:
    """``phalanx.cli.NAME``'s ``main``, imported when called: a subcommand loads only its
    own modules (``phalanx status`` reads a few files; importing the agent for it cost
    about 0.2 s of CPU per call, and scripts and tests make hundreds of such calls)."""

    def call(args: list[str]) -> int:
        command: Callable[[list[str]], int] = import_module(f"phalanx.cli.{name}").main
        return command(args)

    return call


# Subcommands that look at a run (``phalanx NAME RUN_DIR ...``), one row each.
SUBCOMMANDS: dict[str, Callable[[list[str]], int]] = {
    **{name: _subcommand(name) for name in SUBCOMMAND_NAMES if name != "help"},
    "help": lambda args: help_command(args),
}


def help_command(args: list[str]) -> int:
    """``phalanx help [SUBCOMMAND]``."""
    if args and args[0] in SUBCOMMANDS and args[0] != "help":
        return SUBCOMMANDS[args[0]](["--help"])
    if args and args[0] not in ("help", "-h", "--help"):
        raise UsageError(
            f"help: unknown subcommand {args[0]!r}{did_you_mean(args[0], SUBCOMMANDS)} "
            f"(subcommands: {', '.join(SUBCOMMAND_NAMES)})"
        )
    from phalanx.cli.parser import build_parser

    build_parser(os.environ).print_help()
    return 0


def _near_subcommand(word: str, environ: Mapping[str, str]) -> str | None:
    """The problem with a first word that is no file but close to a subcommand's name."""
    if word.startswith("-") or Path(word).exists() or shutil.which(word, path=environ.get("PATH")):
        return None
    hint = did_you_mean(word, SUBCOMMANDS)
    if not hint:
        return None
    return (
        f"{word!r} is neither a training script nor a subcommand{hint} "
        f"(subcommands: {', '.join(SUBCOMMAND_NAMES)})"
    )


def run(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    # The launch path's modules (the agent and all it runs), imported only to launch; what
    # only --hosts or --dry-run uses, only then (a launch's own start is on its critical path).
    from phalanx.cli.argv import read_launch

    argv, launch = read_launch(argv, environ)
    config = launch.config
    if config.remote.hosts:
        from phalanx.hosts.run import run_hosts

        return run_hosts(config, argv)
    if config.dry_run:
        from phalanx.cli import preempt
        from phalanx.plan import describe

        settings = preempt.describe(
            config.recovery.preempt_signals, config.recovery.preempt_grace, config.recovery.requeue
        )
        plan = describe(launch.dry_run_plan(environ), environ)
        print("\n".join((*config.derived, plan, settings)))
        return 0
    for line in config.derived:
        log.info("%s", line)
    return launch.run(environ, contain=True)


def main(argv: Sequence[str] | None = None) -> int:
    configure_logging()
    try:
        return _main(sys.argv[1:] if argv is None else list(argv))
    finally:
        settle(sys.stdout, sys.stderr)  # a closed terminal must not change the exit code


def _main(args: list[str]) -> int:
    try:
        # A subcommand, unless a training script is called that (torchrun's flags stay as is).
        command = SUBCOMMANDS.get(args[0]) if args else None
        if command is not None and not Path(args[0]).is_file():
            return command(args[1:])
        if args and (problem := _near_subcommand(args[0], os.environ)) is not None:
            raise UsageError(problem)
        return run(args, os.environ)
    except UsageError as exc:
        for problem in exc.problems:
            _say(f"phalanx: error: {problem}")
        return exc.exit_code
    except Interrupted as exc:  # Preempted too
        _say(f"phalanx: {stopped_line(exc)}")
        return exc.exit_code
    except JobFailed as exc:  # the framed report just printed names the cause: not twice
        return exc.exit_code
    except PhalanxError as exc:
        _say(f"phalanx: {exc}")
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


def _say(line: str) -> None:
    """The last line on stderr; one that cannot be written (its terminal closed: the
    SIGHUP that ended the job) is let go, the exit code is what matters then."""
    with contextlib.suppress(OSError, ValueError):
        print(line, file=sys.stderr, flush=True)


def entry() -> NoReturn:
    """The ``phalanx`` command and ``python -m phalanx``: ``main``, then the launcher's exit
    without the interpreter's teardown where nothing is left for it (``worker.leave``)."""
    exit_launcher(main())


if __name__ == "__main__":
    entry()
