"""``phalanx`` / ``python -m phalanx``: parse, plan, run; map errors to exit codes."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

from phalanx.agent import Agent, configure_logging
from phalanx.cli.convert import to_config
from phalanx.cli.parser import build_parser
from phalanx.config import LaunchConfig
from phalanx.errors import Interrupted, PhalanxError, UsageError
from phalanx.plan import build_plan, describe
from phalanx.rendezvous.api import RendezvousHandler
from phalanx.rendezvous.local import LocalRendezvous


def parse_config(argv: Sequence[str], environ: Mapping[str, str]) -> LaunchConfig:
    ns = build_parser(environ).parse_args(list(argv))
    return to_config(ns, environ)


def make_rendezvous(config: LaunchConfig) -> RendezvousHandler:
    if not config.is_multi_node:
        if config.rdzv_backend == "static" and not config.standalone:
            return LocalRendezvous(
                config.rdzv_id, config.master_addr, first_port=config.master_port
            )
        return LocalRendezvous(None if config.standalone else config.rdzv_id)
    raise UsageError(
        f"--nnodes {config.min_nodes}:{config.max_nodes}: multi-node jobs are not available in this "
        "build of phalanx yet; run with --nnodes 1 (or --standalone)"
    )


def run(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    config = parse_config(argv, environ)
    rendezvous = make_rendezvous(config)
    if config.dry_run:
        from pathlib import Path

        result = rendezvous.next_round(config.nproc_per_node)
        plan = build_plan(config, result, Path(config.log_dir or "<run directory>"), environ)
        print(describe(plan, environ))
        return 0
    return Agent(config, rendezvous, environ).run()


def main(argv: Sequence[str] | None = None) -> int:
    configure_logging()
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        return run(args, os.environ)
    except UsageError as exc:
        for problem in exc.problems:
            print(f"phalanx: error: {problem}", file=sys.stderr)
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
