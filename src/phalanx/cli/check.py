"""``phalanx check``: the node check on its own, before a big job (``phalanx.nodecheck``).

Run on every node with the rendezvous flags of the job (``--nnodes``, ``--rdzv-*``,
``--nproc-per-node``, ``--checkpoint-dir``, ``--node-check-thresholds``...), or once with
``--hosts``/``--hostfile`` (it then runs itself on every host over ssh, as a job would).
Each node prints the same table; exit 0 when no node was named, 1 when one was.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from phalanx.cli.argv import expanded, parse_config
from phalanx.config import LaunchConfig
from phalanx.errors import PhalanxError, UsageError
from phalanx.hosts.run import run_hosts
from phalanx.launch import prepare
from phalanx.nodecheck import Skipped, check_round, table
from phalanx.resources.rundir import default_log_base

# The job parser needs a program: this one is never run (it marks a check's command line,
# so a ``--hosts`` check reaches every host as a check again).
PROGRAM = "phalanx.nodecheck"
# How long a node waits for the others to have read every record before it leaves (the
# store's host must stay until then), unless --rdzv-conf exit_barrier_timeout says.
EXIT_BARRIER = 30

HELP = """\
usage: phalanx check [--hosts H1:N,H2:N | --hostfile FILE | the job's rendezvous flags]
                     [--nproc-per-node N] [--checkpoint-dir DIR]
                     [--node-check-thresholds compute=3,throughput=10,latency=10,...]

Check the nodes of a multi-node job before it starts: the same check every multi-node
job runs before each round (a fixed matmul on the workers' device, a TCP test of each
node's link to the next, the log and checkpoint directories writable and not full, on
GPUs the device count), printed as a table with the medians. Run it on every node with
the job's rendezvous flags (--nnodes, --rdzv-backend, --rdzv-endpoint, --rdzv-id, ...),
or once with --hosts/--hostfile (over ssh, like a job). Exit status: 0 when no node was
named, 1 when one was (its line says why), 2 on a usage error.
"""


def main(args: list[str]) -> int:
    if args and args[0] in ("-h", "--help"):
        print(HELP, end="")
        return 0
    if "--dry-run" in args:
        raise UsageError("phalanx check: --dry-run has no meaning here (the check is the test)")
    # A --hosts check reaches each host with the program already in place.
    argv = expanded(args if args[-1:] == [PROGRAM] else [*args, "-m", PROGRAM], os.environ)
    config = parse_config(argv, os.environ)
    if config.remote.hosts:
        return run_hosts(config, ["check", *argv])
    if not config.rendezvous.is_multi_node:
        raise UsageError(
            "phalanx check compares nodes: give --hosts/--hostfile, or the job's rendezvous "
            "flags with --nnodes 2 or more"
        )
    return _check(config)


def _check(config: LaunchConfig) -> int:
    if (
        "exit_barrier_timeout" not in config.rendezvous.rdzv_conf_dict
    ):  # a straggler must not hold it
        conf = (*config.rendezvous.rdzv_conf, ("exit_barrier_timeout", str(EXIT_BARRIER)))
        config = replace(config, rendezvous=replace(config.rendezvous, rdzv_conf=conf))
    rdzv = prepare(config).open_rendezvous()
    try:
        at = rdzv.next_round(config.workers.nproc_per_node)
        joined, exchanges = at.result, at.exchanges()
        assert exchanges is not None  # a multi-node round always has them
        exchange = exchanges.check
        with tempfile.TemporaryDirectory(dir=_log_base(config)) as scratch:
            began = time.monotonic()
            verdict = check_round(
                exchange,
                joined,
                config.checks.node_check,
                Path(scratch),
                config.workers.nproc_per_node,
            )
            seconds = time.monotonic() - began
        if isinstance(verdict, Skipped):
            raise UsageError(f"phalanx check: {verdict.reason}")
        print(
            f"node check, round {joined.round}, {joined.num_nodes} nodes (this is node "
            f"{joined.node_rank}), {seconds:.2f} s:"
        )
        print("\n".join(table(verdict)), flush=True)
        rdzv.report_done(True)
    except BaseException:
        with contextlib.suppress(PhalanxError, OSError):  # no round, or no store: nobody to tell
            rdzv.report_done(False)
        raise
    finally:
        rdzv.shutdown()
    return 1 if verdict.named else 0


def _log_base(config: LaunchConfig) -> Path:
    """Where this node's runs go (the run directory the check writes to in a job)."""
    base = config.logs.log_dir or default_log_base()
    base.mkdir(parents=True, exist_ok=True, mode=0o700)
    return base


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
