"""``phalanx`` / ``python -m phalanx``: parse, plan, run; map errors to exit codes."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from phalanx.agent import Agent, configure_logging
from phalanx.cli import logs, ls, preempt, stacks, status, stop, timeline
from phalanx.cli.convert import to_config
from phalanx.cli.parser import build_parser
from phalanx.cli.scheduler import derive
from phalanx.config import LaunchConfig
from phalanx.errors import Interrupted, PhalanxError, Preempted, UsageError
from phalanx.hosts.run import run_hosts
from phalanx.launch import prepare
from phalanx.plan import describe
from phalanx.supervisor.console import settle

log = logging.getLogger("phalanx")

# Subcommands that look at a run (``phalanx NAME RUN_DIR ...``), one row each.
SUBCOMMANDS: dict[str, Callable[[list[str]], int]] = {
    "stacks": stacks.main,
    "timeline": timeline.main,
    "status": status.main,
    "logs": logs.main,
    "stop": stop.main,
    "ls": ls.main,
}


def parse_config(argv: Sequence[str], environ: Mapping[str, str]) -> LaunchConfig:
    ns = build_parser(environ).parse_args(list(argv))
    ns, derivation = derive(ns, argv, environ)
    return to_config(ns, environ, derivation=derivation)


def run(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    config = parse_config(argv, environ)
    if config.hosts:
        return run_hosts(config, argv)
    launch = prepare(config)
    if config.dry_run:
        settings = preempt.describe(config.preempt_signals, config.preempt_grace, config.requeue)
        plan = describe(launch.dry_run_plan(environ), environ)
        print("\n".join((*config.derived, plan, settings)))
        return 0
    for line in config.derived:
        log.info("%s", line)
    return Agent(config, launch.open_rendezvous, launch.run_id, environ, contain=True).run()


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
        return run(args, os.environ)
    except UsageError as exc:
        for problem in exc.problems:
            _say(f"phalanx: error: {problem}")
        return exc.exit_code
    except Preempted as exc:
        _say(f"phalanx: {exc}; exit {exc.exit_code} (run the job again)")
        return exc.exit_code
    except Interrupted as exc:
        _say(f"phalanx: stopped by {exc}")
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

if __name__ == "__main__":
    sys.exit(main())
