"""What runs on a node and how its workers are started and watched (torch's ``WorkerSpec``)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class LaunchMode(Enum):
    SCRIPT = "script"  # python -u script.py args
    MODULE = "module"  # python -u -m module args
    NO_PYTHON = "no_python"  # the program is executed directly
    RUN_PATH = "run_path"  # runpy.run_path(script) inside phalanx's worker bootstrap


@dataclass(frozen=True)
class WorkersConfig:
    program: str
    program_args: tuple[str, ...] = ()
    mode: LaunchMode = LaunchMode.SCRIPT
    nproc_per_node: int = 1
    role: str = "default"
    monitor_interval: float = 0.1
    shutdown_timeout: float = 5.0
    signals_to_handle: tuple[str, ...] = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
    virtual_local_rank: bool = False
    start_method: str = "spawn"
    # Fork workers from a per-node template that imported torch once (phalanx.supervisor.warm);
    # False (--cold-start) execs every worker. --no-python programs are always exec'd.
    warm_start: bool = True
    preload: tuple[str, ...] = ()  # modules the template imports besides torch (--preload)
    # Seconds the user's warm service stays after its last job (--keep-warm); 0: a per-run
    # template (phalanx.supervisor.warmservice).
    keep_warm: float = 0.0
    # One process per node that spawns its own workers (TRELLIS.2 style); phalanx appends
    # its node facts as flags, named by ``spawn_owner_flags`` (fact -> flag).
    spawn_owner: bool = False
    spawn_owner_flags: tuple[tuple[str, str], ...] = ()
