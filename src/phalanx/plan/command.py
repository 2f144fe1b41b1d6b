"""The argv every worker runs: torchrun's command, with phalanx's worker-side code first."""

from __future__ import annotations

import sys
from pathlib import Path

from phalanx.config import LaunchConfig, LaunchMode
from phalanx.rendezvous.api import RendezvousResult

# Every python worker runs phalanx's worker-side code first (progress counters for hang
# detection, stack dumps on SIGUSR2), then the user's program; see phalanx.worker.boot.
WORKER_BOOT = ("-m", "phalanx.worker.boot")


def worker_command(
    config: LaunchConfig, python: str = sys.executable, *, boot: bool = True
) -> tuple[str, ...]:
    """The argv every worker runs (the same on every rank): torchrun's command, with
    ``-m phalanx.worker.boot`` before the program when ``boot`` (``--no-python`` programs
    run as given)."""
    args = config.program_args
    if config.mode is LaunchMode.NO_PYTHON:
        return (config.program, *args)
    entry = WORKER_BOOT if boot else ()
    if config.mode is LaunchMode.MODULE:
        return (python, "-u", *entry, "-m", config.program, *args)
    if config.mode is LaunchMode.RUN_PATH:
        return (
            python,
            "-u",
            *entry,
            "-m",
            "phalanx.worker.run_path",
            str(Path(config.program).resolve()),
            *args,
        )
    return (python, "-u", *entry, config.program, *args)


def spawn_owner_argv(config: LaunchConfig, rdzv: RendezvousResult) -> tuple[str, ...]:
    """The worker command plus this node's facts as flags (TRELLIS.2's names by default)."""
    facts = {
        "num_nodes": rdzv.num_nodes,
        "node_rank": rdzv.node_rank,
        "num_gpus": config.nproc_per_node,
        "master_addr": rdzv.master_addr,
        "master_port": rdzv.master_port,
    }
    extra = (part for fact, flag in config.spawn_owner_flags for part in (flag, str(facts[fact])))
    # The owner is not a rank (its workers are its own children): no worker-side code.
    return (*worker_command(config, boot=False), *extra)
