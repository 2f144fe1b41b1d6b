"""What a launcher tells its workers, read as plain data from an environment mapping.

``read_launch_env(env)`` is pure (no ``os.environ``, no torch). Launchers only rename the
same few facts, so they are rows of one table (``phalanx.environments.LAUNCHERS``, a row in
each environment's module), tried in order; the first whose marker variable is set wins, so
a torchrun started inside ``srun`` counts as torchrun:

========  ===============================================  =================================
launcher  rank / local rank / world size                   MASTER_ADDR / MASTER_PORT
========  ===============================================  =================================
env       RANK / LOCAL_RANK / WORLD_SIZE (phalanx,         required (these launchers set
          torchrun, ``phalanx.spawn``)                     both)
slurm     SLURM_PROCID / SLURM_LOCALID / SLURM_NTASKS,     default: first host of the step's
          only inside an ``srun`` step (SLURM_STEP_ID      nodelist / 15000 + SLURM_JOB_ID
          set): the batch script itself also has           mod 10000 (reported in ``notes``)
          SLURM_PROCID=0 but is not a worker
openmpi   OMPI_COMM_WORLD_RANK / _LOCAL_RANK / _SIZE       default addr ``localhost`` when all
                                                           ranks share one node; port required
pmi       PMI_RANK / MPI_LOCALRANKID / PMI_SIZE (MPICH,    as openmpi (``MPI_LOCALNRANKS``)
          Intel MPI)
========  ===============================================  =================================

``MASTER_ADDR``/``MASTER_PORT`` in the environment always win over a derived default
(``mpirun -x MASTER_ADDR=host0 -x MASTER_PORT=29500``; ``export`` before ``srun``).
``PHALANX_BACKEND``, when set (``phalanx.spawn`` sets it), is the backend the launcher chose.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from phalanx.environments import LAUNCHERS
from phalanx.environments.facts import Derive
from phalanx.errors import UsageError

BACKEND_ENV = "PHALANX_BACKEND"


def check_count(name: str, value: int) -> list[str]:
    """Problems with a count that must be >= 1 (empty when fine)."""
    return [] if value >= 1 else [f"{name} must be >= 1, got {value}"]


def check_index(name: str, value: int, bound_name: str, bound: int) -> list[str]:
    """Problems with an index that must be >= 0 and, when ``bound >= 1``, < ``bound``."""
    if value < 0:
        return [f"{name} must be >= 0, got {value}"]
    if bound >= 1 and value >= bound:
        return [f"{name} must be < {bound_name} ({bound}), got {value}"]
    return []


@dataclass(frozen=True)
class LaunchEnv:
    """What a launcher told one worker: plain data read from an environment mapping."""

    launcher: str
    rank: int
    local_rank: int
    world_size: int
    master_addr: str
    master_port: int
    notes: tuple[str, ...] = ()  # defaults that were derived, for the caller to log
    backend: str = "auto"  # PHALANX_BACKEND: the backend phalanx.spawn resolved for the job


def read_launch_env(env: Mapping[str, str]) -> LaunchEnv | None:
    """Pure: the launch facts in ``env``, or None when no known launcher started this process.

    Raises ``UsageError`` listing every problem (missing or non-integer variables, ranks out
    of range, no master address/port and none derivable).
    """
    lv = next((lv for lv in LAUNCHERS if lv.marker in env), None)
    if lv is None:
        return None
    problems: list[str] = []
    notes: list[str] = []

    def integer(var: str) -> int:
        raw = env.get(var)
        if raw is None:
            problems.append(f"{lv.name} launcher: {var} is not set")
        else:
            try:
                return int(raw)
            except ValueError:
                problems.append(f"{lv.name} launcher: {var}={raw!r} is not an integer")
        return 0

    def master(var: str, derive: Derive) -> str:
        if env.get(var):
            return env[var]
        value = derive(env)
        if value is None:
            problems.append(f"{var} is not set and cannot be derived; hint: {lv.hint}")
            return ""
        notes.append(f"{var} not set; derived {value} from the {lv.name} environment")
        return value

    rank, local_rank, size = integer(lv.rank), integer(lv.local_rank), integer(lv.world_size)
    problems += check_count(lv.world_size, size) if lv.world_size in env else []
    problems += check_index(lv.rank, rank, lv.world_size, size)
    problems += check_index(lv.local_rank, local_rank, "", 0)
    addr = master("MASTER_ADDR", lv.default_addr)
    port_text = master("MASTER_PORT", lv.default_port)
    port = int(port_text) if port_text.isascii() and port_text.isdigit() else -1
    if port_text and not 0 < port < 65536:
        problems.append(f"MASTER_PORT must be a TCP port (1-65535), got {port_text!r}")
    if problems:
        raise UsageError(problems)
    backend = env.get(BACKEND_ENV, "auto")
    return LaunchEnv(lv.name, rank, local_rank, size, addr, port, tuple(notes), backend)
