"""``phalanx stop RUN_DIR``: stop the whole job cleanly, from any of its nodes.

Sends ``SIGTERM`` to the run's agent (its pid in ``RUN_DIR/launcher.json``, checked to be
that same process by its start time, so a reused pid is never signalled), as a scheduler
would, but as a stop even where SIGTERM is a preemption signal (``--preempt-signals``:
a marker file it leaves first says so; no grace, no requeue). The agent stops its workers (SIGTERM, the grace, SIGKILL), tells the other nodes,
which stop theirs, and every node writes its ``report.json`` (no root cause; which node was
stopped, by which signal) and exits 143, as for SIGTERM. This command waits for this
node's agent to end (``--timeout``) and says where the report is.

A run directory that cannot take the marker (read-only, full) costs a warning, and the
SIGTERM still goes. One that was deleted under a running job has no ``launcher.json``
left: the command names the agent's pid (the process holding the run's ``events.jsonl``
open) and how to stop it, exit 1.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from phalanx.cli.args import Parser, add_run_dir, run_directory
from phalanx.errors import PhalanxError
from phalanx.events.log import EVENTS_FILE
from phalanx.status.files import leave_stop_marker, stop_marker
from phalanx.status.launcher import holders, read_launcher
from phalanx.status.view import is_run_dir


def parse(argv: list[str]) -> argparse.Namespace:
    parser = Parser(
        prog="phalanx stop",
        description=(
            "Stop a running job on every node (SIGTERM to its agent): the workers are "
            "stopped, the report written, and the job exits 143."
        ),
    )
    add_run_dir(parser)
    parser.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        help="Seconds to wait for this node's agent to end (default 120).",
    )
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse(argv)
    if not is_run_dir(Path(args.run_dir)):
        _gone(Path(args.run_dir))
    run_dir = run_directory("stop", args.run_dir)
    agent = read_launcher(run_dir)
    if agent is None:
        raise PhalanxError(f"{run_dir}: no readable launcher.json; is the job running here?")
    if not agent.here:
        raise PhalanxError(f"the agent of {run_dir} runs on {agent.host}; run phalanx stop there")
    if not agent.alive():
        raise PhalanxError(
            f"the job of {run_dir} is not running (its agent, pid {agent.pid}, ended)"
        )
    try:
        leave_stop_marker(run_dir)  # a stop, also where SIGTERM would mean a preemption
    except OSError as exc:  # a read-only or full run directory: stop the job all the same
        print(
            f"phalanx: warning: cannot write {stop_marker(run_dir)} ({exc.strerror or exc}); "
            "stopping anyway (where SIGTERM is one of --preempt-signals, the job takes it "
            "for a preemption)",
            file=sys.stderr,
        )
    os.kill(agent.pid, signal.SIGTERM)
    print(f"phalanx: stopping the job (SIGTERM to its agent, pid {agent.pid})", file=sys.stderr)
    deadline = time.monotonic() + args.timeout
    while agent.alive():
        if time.monotonic() >= deadline:
            raise PhalanxError(f"the agent (pid {agent.pid}) still runs after {args.timeout:g} s")
        time.sleep(0.1)
    report = run_dir / "report.json"
    where = f"; report: {report}" if report.exists() else " (no report.json was written)"
    print(f"phalanx: the job stopped{where}", file=sys.stderr)
    return 0


def _gone(run_dir: Path) -> None:
    """``run_dir`` is not (or no longer) a run directory: when an agent on this host still
    holds its event log open (the directory was deleted under a running job), name its pid
    and how to stop it (exit 1); otherwise the usual usage error."""
    pids = holders(run_dir, EVENTS_FILE)
    if not pids:
        return  # ``run_directory`` says it is not a run directory (exit 2)
    named = ", ".join(str(pid) for pid in pids)
    raise PhalanxError(
        f"{run_dir} was deleted (no launcher.json or events.jsonl), but its job still runs: "
        f"its agent is pid {named} (it holds {run_dir / EVENTS_FILE} open); stop it with "
        f"kill -TERM {pids[0]}"
    )
