"""``phalanx`` / ``python -m phalanx``: parse, plan, run; map errors to exit codes."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from phalanx.agent import Agent, configure_logging
from phalanx.cli import preempt, stacks
from phalanx.cli.convert import to_config
from phalanx.cli.parser import build_parser
from phalanx.config import LaunchConfig
from phalanx.errors import Interrupted, PhalanxError, Preempted, UsageError
from phalanx.hosts.run import run_hosts
from phalanx.launch import prepare
from phalanx.plan import describe


def parse_config(argv: Sequence[str], environ: Mapping[str, str]) -> LaunchConfig:
    ns = build_parser(environ).parse_args(list(argv))
    return to_config(ns, environ)


def run(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    config = parse_config(argv, environ)
    if config.hosts:
        return run_hosts(config, argv)
    launch = prepare(config)
    if config.dry_run:
        print(describe(launch.dry_run_plan(environ), environ))
        print(preempt.describe(config.preempt_signals, config.preempt_grace, config.requeue))
        return 0
    return Agent(config, launch.open_rendezvous, launch.run_id, environ, contain=True).run()


def main(argv: Sequence[str] | None = None) -> int:
    configure_logging()
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        # A subcommand, unless a training script is called that (torchrun's flags stay as is).
        if args[:1] == ["stacks"] and not Path("stacks").is_file():
            return stacks.main(args[1:])
        return run(args, os.environ)
    except UsageError as exc:
        for problem in exc.problems:
            print(f"phalanx: error: {problem}", file=sys.stderr)
        return exc.exit_code
    except Preempted as exc:
        print(f"phalanx: {exc}; exit {exc.exit_code} (run the job again)", file=sys.stderr)
        return exc.exit_code
    except Interrupted as exc:
        print(f"phalanx: stopped by {exc}", file=sys.stderr)
        return exc.exit_code
    except PhalanxError as exc:
        print(f"phalanx: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
