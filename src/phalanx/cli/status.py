"""``phalanx status RUN_DIR [--json]``: the job's nodes, ranks, steps and last failure.

On a running job the agent is asked (a request file it notices within a second) and, on a
multi-node job, asks every other node through the rendezvous store; nodes that did not
answer are named. A finished run is shown from its files (its final state).
"""

from __future__ import annotations

import argparse
import sys

from phalanx.cli.args import Parser, add_run_dir, run_directory
from phalanx.status.view import dumps, gather, render


def parse(argv: list[str]) -> argparse.Namespace:
    parser = Parser(
        prog="phalanx status",
        description=(
            "Show a job's nodes, hosts, ranks and their state, round and restarts, each "
            "rank's step and steps/s, the time since its last beat, and the last failure "
            "with its root cause; every node of a multi-node job, asked through the store."
        ),
    )
    add_run_dir(parser)
    parser.add_argument("--json", action="store_true", help="Print the status as JSON.")
    parser.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        help="Seconds to wait for the running agent's answer (default 10).",
    )
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse(argv)
    view = gather(run_directory("status", args.run_dir), args.timeout)
    sys.stdout.write(dumps(view) + "\n" if args.json else render(view))
    return 0
