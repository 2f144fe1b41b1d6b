"""How ``phalanx --help`` reads: the usage line with the subcommands, the description and the
examples and exit statuses below the options, every option's default,
and "did you mean" for a near miss (an option, a subcommand, an ``--rdzv-conf`` key)."""

from __future__ import annotations

import argparse

from phalanx.parsing import did_you_mean

__all__ = [
    "DESCRIPTION",
    "EPILOG",
    "KEEP_WARM_HELP",
    "SUBCOMMAND_NAMES",
    "USAGE",
    "HelpFormatter",
    "did_you_mean",
]

# The subcommands (``cli.main`` maps each to its module); ``help`` prints this usage.
SUBCOMMAND_NAMES = (
    "stacks", "status", "logs", "stop", "ls", "clean", "timeline", "check", "service", "help",
)  # fmt: skip

KEEP_WARM_HELP = (
    "Seconds to keep a warm service after the job (default 0: off). The first launch leaves a "
    "process of this user with torch and the --preload modules imported; the next launch with "
    "the same python, installed packages, preload list and import-time environment forks its "
    "workers from it instead of importing torch again. The script and its modules are always "
    "imported fresh; --cold-start and --no-python launches do not use it. See and stop: "
    "phalanx service status|stop."
)

USAGE = f"""\
phalanx [options] training_script [script args ...]
       phalanx {{{",".join(SUBCOMMAND_NAMES)}}} ...   (a subcommand; -h for its help)
       phalanx --version
(a script named like a subcommand runs as ./NAME, or after --: phalanx -- status)"""

DESCRIPTION = """\
phalanx: launch and supervise distributed PyTorch training. A drop-in for torchrun:
the same flags (dash or underscore spelling), the same worker environment (RANK,
LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, ...). Every console line is prefixed with the
worker's global rank and every rank's output is kept in the run directory. When a
worker fails, the others are stopped at once and one report names the root cause;
--max-restarts restarts the whole group on a fresh port."""

EPILOG = """\
examples:
  phalanx --standalone --nproc-per-node 2 train.py --lr 0.1
  phalanx --nproc-per-node 4 --dry-run train.py        # print the plan, start nothing
  phalanx --standalone --nproc-per-node 2 --max-restarts 3 train.py
  phalanx --nproc-per-node 8 --stall-timeout 600 train.py   # hangs fail at once (default: named)
  phalanx --hostfile hosts.txt train.py   # every host over ssh (or --hosts h1:8,h2:8)
  phalanx stacks RUN_DIR       # print every rank's Python stack now; the job goes on
  phalanx status RUN_DIR       # every node's ranks: state, step, steps/s; the last failure
  phalanx logs RUN_DIR --rank 1 --follow    # one rank's logs (phalanx stop RUN_DIR: end it)
  phalanx timeline RUN_DIR -o run.html      # the run drawn, one lane per rank (phalanx ls)
  phalanx clean --older-than 7d   # remove old runs; RUN_DIR may be a name from phalanx ls, or last
  phalanx check --hosts h1:8,h2:8   # check the nodes before a big job (compute, network, disks)
exit status: 0 success; the root-cause worker's exit code (128+N for signal N) on failure,
1 for a hang or a lost node;
2 usage error, or the nodes run different code or versions (see --allow-mismatch);
129/130/143 when interrupted by SIGHUP/SIGINT/SIGTERM;
75 when preempted (--preempt-signals; see docs/how-to/slurm.md, "Preemption");
69 when the node check excluded this node (--node-check exclude);
79 when this node was cut off from the other members (c10d, 3 members or more): the job goes
on without it where a quorum of them met."""


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The description and epilog as written; every option's help ends with its default,
    unless the help text already says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            not action.option_strings
            or "default" in text.lower()
            or action.default is argparse.SUPPRESS
            or isinstance(action, argparse._VersionAction)
        ):
            return text
        default = action.default
        if default is None:
            return f"{text} (default: none)"
        if isinstance(default, list):
            default = ",".join(default) or "none"
        elif default == "":
            default = "none"
        return f"{text} (default: {str(default).replace('%', '%%')})"
