"""``phalanx stacks RUN_DIR``: every rank's Python stack now, on every node; the job goes on.

Reads the launcher's pid from ``RUN_DIR/launcher.json`` and sends it ``SIGUSR2`` (the same
as ``kill -USR2 <launcher pid>``). The launcher has each worker dump its stack (faulthandler,
all threads) and writes them together to ``RUN_DIR/stacks_<time>.txt``, which this command
waits for and prints. On a multi-node job, run on any node, it covers every node: the
launcher asks the others through the rendezvous store and waits up to 20 s for their
answers (``phalanx.hang.jobstacks``); the file has this node first, then the others by node
rank, each under a ``##### node <rank> (<host>) #####`` header, and names any node that did
not answer.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path

from phalanx.cli.args import Parser, add_run_dir, run_directory
from phalanx.errors import PhalanxError, UsageError
from phalanx.hang.stacks import catches
from phalanx.status.launcher import LAUNCHER_FILE
from phalanx.worker.contract import STACK_SIGNAL


def parse(argv: list[str]) -> argparse.Namespace:
    parser = Parser(
        prog="phalanx stacks",
        description=(
            "Print every rank's Python stack now, without stopping the job: every node's on a "
            "multi-node job, grouped by node."
        ),
    )
    add_run_dir(parser)
    parser.add_argument(
        "--timeout", type=float, default=45.0, help="Seconds to wait for the dump (default 45)."
    )
    return parser.parse_args(argv)


def launcher_pid(run_dir: Path) -> int:
    """The pid of the launcher running in ``run_dir``, checked to be alive and listening."""
    try:
        data = json.loads((run_dir / LAUNCHER_FILE).read_text())
    except (OSError, ValueError):
        raise UsageError(
            f"stacks: {str(run_dir)!r} is not a phalanx run directory (no readable "
            f"{LAUNCHER_FILE}); is the job running? 'phalanx ls' lists the runs"
        ) from None
    pid = data.get("pid") if isinstance(data, dict) else None
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        raise UsageError(
            f"stacks: {str(run_dir / LAUNCHER_FILE)!r} is malformed (expected a launcher's "
            f'{{"pid": ..., "host": ...}}); \'phalanx ls\' lists the runs'
        )
    if data.get("host", socket.gethostname()) != socket.gethostname():
        raise PhalanxError(
            f"the launcher of {run_dir} runs on {data['host']}; run phalanx stacks there"
        )
    if data.get("stacks_signal") != STACK_SIGNAL.name:
        raise PhalanxError(
            f"the launcher (pid {pid}) does not take stack requests: {STACK_SIGNAL.name} is "
            "in its --signals-to-handle"
        )
    # A stale file may name a pid reused by another process: signal only one that catches
    # the signal (the default action of SIGUSR2 is to terminate).
    if not catches(pid, STACK_SIGNAL):
        raise PhalanxError(f"the launcher of {run_dir} (pid {pid}) is not running")
    return pid


def main(argv: list[str]) -> int:
    args = parse(argv)
    run_dir = run_directory("stacks", args.run_dir)
    pid = launcher_pid(run_dir)
    before = set(run_dir.glob("stacks_*.txt"))
    os.kill(pid, STACK_SIGNAL)
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        new = sorted(set(run_dir.glob("stacks_*.txt")) - before)
        if new:
            sys.stdout.write(new[0].read_text(errors="replace"))
            print(f"phalanx: stacks written to {new[0]}", file=sys.stderr)
            return 0
        time.sleep(0.1)
    raise PhalanxError(
        f"no stacks from the launcher (pid {pid}) in {args.timeout:g} s; are its workers running?"
    )
