"""``phalanx`` / ``python -m phalanx``: parse, plan, run; map errors to exit codes."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from phalanx.agent import Agent, configure_logging
from phalanx.cli import stacks
from phalanx.cli.convert import to_config
from phalanx.cli.parser import build_parser
from phalanx.config import LaunchConfig
from phalanx.errors import Interrupted, PhalanxError, UsageError
from phalanx.plan import build_plan, describe
from phalanx.rendezvous.api import NodeInfo, RendezvousHandler, RendezvousResult
from phalanx.rendezvous.local import LocalRendezvous
from phalanx.rendezvous.registry import create_handler, spec_problems
from phalanx.rendezvous.spec import RendezvousSpec


def parse_config(argv: Sequence[str], environ: Mapping[str, str]) -> LaunchConfig:
    ns = build_parser(environ).parse_args(list(argv))
    return to_config(ns, environ)


def rendezvous_spec(config: LaunchConfig) -> RendezvousSpec:
    return RendezvousSpec(
        backend=config.rdzv_backend,
        run_id=config.rdzv_id,
        min_nodes=config.min_nodes,
        max_nodes=config.max_nodes,
        endpoint=config.rdzv_endpoint,
        conf=config.rdzv_conf_dict,
        node_rank=config.node_rank if config.rdzv_backend == "static" else None,
        master_addr=config.master_addr,
        master_port=config.master_port,
        local_addr=config.local_addr,
        worker_port=config.worker_port,
    )


def plan_rendezvous(config: LaunchConfig) -> tuple[str, Callable[[], RendezvousHandler]]:
    """The run id, and how to open this node's rendezvous (not opened yet: see ``Agent``).

    A single-node job needs no store: ``LocalRendezvous`` just picks a fresh port per round.
    Multi-node specs are validated here, so usage problems surface before anything starts.
    """
    if not config.is_multi_node:
        if config.standalone or config.rdzv_id == "none":
            run_id = str(uuid.uuid4())
        else:
            run_id = config.rdzv_id
        first_port = (
            config.master_port
            if config.rdzv_backend == "static" and not config.standalone
            else None
        )
        addr = "localhost" if first_port is None else config.master_addr
        return run_id, lambda: LocalRendezvous(
            run_id, addr, first_port=first_port, worker_port=config.worker_port
        )
    spec = rendezvous_spec(config)
    _, problems = spec_problems(spec)
    if problems:
        raise UsageError(problems)
    return config.rdzv_id, lambda: create_handler(spec)


def run(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    config = parse_config(argv, environ)
    run_id, open_rendezvous = plan_rendezvous(config)
    if config.dry_run:
        print(
            describe(
                build_plan(
                    config, dry_run_result(config, run_id), Path("<run directory>"), environ
                ),
                environ,
            )
        )
        return 0
    return Agent(config, open_rendezvous, run_id, environ).run()


def dry_run_result(config: LaunchConfig, run_id: str) -> RendezvousResult:
    """What this node's plan would be, without meeting anyone: every node is assumed to
    have this node's worker count; the master port is shown as 0 (chosen per round)."""
    node_rank = config.node_rank if config.is_multi_node else 0
    nodes = tuple(
        NodeInfo(rank, "<host>", "<addr>", config.nproc_per_node)
        for rank in range(max(config.max_nodes, node_rank + 1))
    )
    master = config.master_addr if config.rdzv_backend == "static" else "<rendezvous>"
    return RendezvousResult(
        run_id, 0, 0, node_rank, nodes, "localhost" if not config.is_multi_node else master, 0
    )


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
