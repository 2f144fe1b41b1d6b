"""``phalanx`` / ``python -m phalanx``: parse, plan, run; map errors to exit codes."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from phalanx.agent import Agent, configure_logging
from phalanx.cli import clean, logs, ls, preempt, stacks, status, stop, timeline
from phalanx.cli.convert import to_config
from phalanx.cli.parser import build_parser
from phalanx.cli.scheduler import derive
from phalanx.config import LaunchConfig
from phalanx.errors import Interrupted, JobFailed, PhalanxError, UsageError, stopped_line
from phalanx.hosts.run import run_hosts
from phalanx.launch import prepare
from phalanx.plan import describe

log = logging.getLogger("phalanx")

# Subcommands that look at a run (``phalanx NAME RUN_DIR ...``), one row each.
SUBCOMMANDS: dict[str, Callable[[list[str]], int]] = {
    "stacks": stacks.main,
    "timeline": timeline.main,
    "status": status.main,
    "logs": logs.main,
    "stop": stop.main,
    "ls": ls.main,
    "clean": clean.main,
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
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        # A subcommand, unless a training script is called that (torchrun's flags stay as is).
        command = SUBCOMMANDS.get(args[0]) if args else None
        if command is not None and not Path(args[0]).is_file():
            return command(args[1:])
        return run(args, os.environ)
    except UsageError as exc:
        for problem in exc.problems:
            print(f"phalanx: error: {problem}", file=sys.stderr)
        return exc.exit_code
    except Interrupted as exc:  # Preempted too
        print(f"phalanx: {stopped_line(exc)}", file=sys.stderr)
        return exc.exit_code
    except JobFailed as exc:  # the framed report just printed names the cause: not twice
        return exc.exit_code
    except PhalanxError as exc:
        print(f"phalanx: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
