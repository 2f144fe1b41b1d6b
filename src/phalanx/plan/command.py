"""What every worker runs, as data: torchrun's command, with phalanx's worker-side code first.

``WorkerCommand`` is what the planner decides; ``argv`` (for an exec'd worker, and for
``--dry-run``) and ``python_main`` (what a forked worker runs as ``__main__``) are derived
from it, so no one ever parses an argv back.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path

from phalanx.config import LaunchMode, WorkersConfig
from phalanx.rendezvous.api import RendezvousResult
from phalanx.worker.contract import BOOT_SHIM

# Every python worker runs phalanx's worker-side code first (progress counters for hang
# detection, stack dumps on SIGUSR2), then the user's program; see phalanx.worker.boot. It
# starts with ``-c BOOT_SHIM``, not ``-m``: the working directory stays off ``sys.path``
# until the user's code runs (``phalanx.worker.contract.isolated_main``).
BOOT_MODULE = "phalanx.worker.boot"
WORKER_BOOT = ("-c", BOOT_SHIM)


@dataclass(frozen=True)
class WorkerCommand:
    kind: str  # "script" or "module" (run by python -u), "program" (--no-python: exec'd)
    target: str  # the script's path, the module's name, or the program
    args: tuple[str, ...] = ()
    python: str = sys.executable
    boot: bool = True  # phalanx's worker-side code (``phalanx.worker.boot``) first

    def python_main(self) -> tuple[str, str, tuple[str, ...]] | None:
        """What ``python -u`` runs: (``script`` or ``module``, target, args), or (``boot``,
        ``BOOT_MODULE``, ``[-m] TARGET ARGS``) for phalanx's worker-side code first; None
        for a program that is not run by python."""
        if self.kind == "program":
            return None
        if not self.boot:
            return self.kind, self.target, self.args
        into = ("-m", self.target) if self.kind == "module" else (self.target,)
        return "boot", BOOT_MODULE, (*into, *self.args)

    @property
    def argv(self) -> tuple[str, ...]:
        main = self.python_main()
        if main is None:
            return (self.target, *self.args)
        kind, target, args = main
        how = {"boot": WORKER_BOOT, "module": ("-m", target), "script": (target,)}[kind]
        return (self.python, "-u", *how, *args)


def worker_command(
    workers: WorkersConfig, python: str = sys.executable, *, boot: bool = True
) -> WorkerCommand:
    """The command every worker runs (the same on every rank): torchrun's, with phalanx's
    worker-side code first when ``boot`` (``--no-python`` programs run as given)."""
    args = workers.program_args
    if workers.mode is LaunchMode.NO_PYTHON:
        return WorkerCommand("program", workers.program, args)
    if workers.mode is LaunchMode.MODULE:
        return WorkerCommand("module", workers.program, args, python, boot)
    if workers.mode is LaunchMode.RUN_PATH:
        script = str(Path(workers.program).resolve())
        return WorkerCommand("module", "phalanx.worker.run_path", (script, *args), python, boot)
    return WorkerCommand("script", workers.program, args, python, boot)


def spawn_owner_command(workers: WorkersConfig, rdzv: RendezvousResult) -> WorkerCommand:
    """The worker command plus this node's facts as flags (TRELLIS.2's names by default)."""
    facts = {
        "num_nodes": rdzv.num_nodes,
        "node_rank": rdzv.node_rank,
        "num_gpus": workers.nproc_per_node,
        "master_addr": rdzv.master_addr,
        "master_port": rdzv.master_port,
    }
    extra = (part for fact, flag in workers.spawn_owner_flags for part in (flag, str(facts[fact])))
    # The owner is not a rank (its workers are its own children): no worker-side code.
    command = worker_command(workers, boot=False)
    return replace(command, args=(*command.args, *extra))
