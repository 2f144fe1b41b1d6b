"""The in-script API: TRELLIS.2-style flags, rank arithmetic, and process-group setup.

Two ways for a worker to join its process group:

* ``setup_dist(rank, local_rank, world_size, master_addr, master_port)`` -- the program owns
  its launch (TRELLIS.2's ``train.py``): it knows its ranks and says so.
* ``init()`` -- the worker was started by a launcher and reads what that launcher exported.
  Supported: phalanx, torchrun and ``phalanx.spawn`` (RANK/LOCAL_RANK/WORLD_SIZE),
  ``srun`` (SLURM_PROCID/SLURM_LOCALID/SLURM_NTASKS, master address and port derived from
  the nodelist and job id when not exported), ``mpirun`` (OMPI_COMM_WORLD_*) and MPICH/Intel
  MPI (PMI_RANK/PMI_SIZE, MASTER_ADDR/MASTER_PORT exported). The table and the rules live in
  ``phalanx.inscript.envs``.

The backend follows the hardware unless given: NCCL where CUDA is available, Gloo otherwise.
The device is ``cuda:<local_rank>`` where CUDA is available (``cuda:0`` when exactly one GPU is
visible to the process, as with ``srun --gpus-per-task=1``), else ``cpu``.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as tdist

from phalanx.environments import LAUNCHERS
from phalanx.errors import UsageError
from phalanx.inscript.envs import check_count, check_index, read_launch_env

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = timedelta(minutes=10)


def _default_num_gpus() -> int:
    # device_count() asks NVML, so it does not initialise CUDA (fork stays safe).
    return torch.cuda.device_count() or 1


def _dist_flags() -> list[tuple[str, dict[str, Any]]]:
    """TRELLIS.2's five flags and ``--backend``, with their defaults (``--num_gpus``'s is
    counted when asked)."""
    return [
        ("--num_nodes", {"type": int, "default": 1, "help": "number of nodes (default: 1)"}),
        (
            "--node_rank",
            {"type": int, "default": 0, "help": "rank of this node, 0..num_nodes-1 (default: 0)"},
        ),
        (
            "--num_gpus",
            {
                "type": int,
                "default": _default_num_gpus(),
                "help": "worker processes on this node: one per GPU; on a CPU-only machine the "
                "number of CPU workers (default: visible CUDA GPUs, or 1 without CUDA)",
            },
        ),
        (
            "--master_addr",
            {
                "default": "localhost",
                "help": "address of node 0, reachable from every node (default: localhost)",
            },
        ),
        (
            "--master_port",
            {
                "type": str,
                "default": "12345",
                "help": "free TCP port on node 0 for the rendezvous store (default: 12345)",
            },
        ),
        (
            "--backend",
            {
                "choices": ("auto", *_BACKENDS),
                "default": "auto",
                "help": "collective backend; auto = nccl with CUDA, gloo without (default: auto)",
            },
        ),
    ]


def add_dist_args(parser: argparse.ArgumentParser) -> None:
    """Register TRELLIS.2's distributed flags (same names and defaults) plus ``--backend``.

    ``--num_gpus`` is the number of worker processes per node: by default one per visible
    CUDA GPU; on a machine without CUDA it counts CPU worker processes and defaults to 1.
    A flag the parser already has (TRELLIS.2's ``train.py`` defines all five itself) is kept
    as it is, with its own default and type: only the missing ones are added.
    """
    flags = _dist_flags()
    # argparse has no public "has this option"; its table of option strings is the one place.
    taken = parser._option_string_actions
    missing = [(flag, options) for flag, options in flags if flag not in taken]
    if missing:
        group = parser.add_argument_group("distributed")
        for flag, options in missing:
            group.add_argument(flag, **options)


def global_rank(node_rank: int, num_gpus: int, local_rank: int) -> int:
    """``node_rank * num_gpus + local_rank``; raises ``UsageError`` on out-of-range input."""
    problems = check_count("num_gpus", num_gpus)
    problems += check_index("node_rank", node_rank, "num_nodes", 0)
    problems += check_index("local_rank", local_rank, "num_gpus", num_gpus)
    if problems:
        raise UsageError(problems)
    return node_rank * num_gpus + local_rank


def world_size(num_nodes: int, num_gpus: int) -> int:
    """``num_nodes * num_gpus``; raises ``UsageError`` unless both are >= 1."""
    problems = check_count("num_nodes", num_nodes) + check_count("num_gpus", num_gpus)
    if problems:
        raise UsageError(problems)
    return num_nodes * num_gpus


def check_node(num_nodes: int, node_rank: int, num_gpus: int) -> None:
    """Validate a node's flags together (``node_rank < num_nodes``); all problems at once."""
    problems = check_count("num_nodes", num_nodes) + check_count("num_gpus", num_gpus)
    problems += check_index("node_rank", node_rank, "num_nodes", num_nodes)
    if problems:
        raise UsageError(problems)


@dataclass(frozen=True)
class _Backend:
    usable: Callable[[], bool]
    hint: str


_BACKENDS: dict[str, _Backend] = {
    "nccl": _Backend(
        torch.cuda.is_available,
        "CUDA is not available and NCCL needs CUDA GPUs; use --backend gloo (or auto)",
    ),
    "gloo": _Backend(lambda: True, ""),
}


def resolve_backend(backend: str) -> str:
    """'auto' -> 'nccl' with CUDA, else 'gloo'; a named backend is checked against the machine."""
    if backend == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    entry = _BACKENDS.get(backend)
    if entry is None:
        known = ", ".join(["auto", *_BACKENDS])
        raise UsageError(f"unknown backend {backend!r}; known: {known}")
    if not entry.usable():
        raise UsageError(f"backend {backend!r} is not usable here: {entry.hint}")
    return backend


@dataclass(frozen=True)
class DistInfo:
    """Where this worker stands once its process group is up."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    backend: str


def _select_device(local_rank: int) -> torch.device:
    if not torch.cuda.is_available():
        return torch.device("cpu")
    count = torch.cuda.device_count()
    if local_rank < count:
        index = local_rank
    elif count == 1:
        index = 0  # the scheduler bound one GPU to this process through CUDA_VISIBLE_DEVICES
    else:
        raise UsageError(
            f"local rank {local_rank} has no GPU: {count} visible; "
            "hint: start at most one worker per GPU on each node"
        )
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def _init_group(
    rank: int,
    local_rank: int,
    size: int,
    init_method: str,
    backend: str,
    timeout: timedelta,
) -> DistInfo:
    """The one path both entry points take: device, backend, process group (once)."""
    if tdist.is_initialized():
        return DistInfo(
            tdist.get_rank(),
            local_rank,
            tdist.get_world_size(),
            _select_device(local_rank),
            str(tdist.get_backend()),
        )
    name = resolve_backend(backend)
    device = _select_device(local_rank)
    tdist.init_process_group(
        name, init_method=init_method, rank=rank, world_size=size, timeout=timeout
    )
    return DistInfo(rank, local_rank, size, device, name)


def setup_dist(
    rank: int,
    local_rank: int,
    world_size: int,
    master_addr: str,
    master_port: str | int,
    backend: str = "auto",
    timeout: timedelta = DEFAULT_TIMEOUT,
) -> DistInfo:
    """TRELLIS.2's ``setup_dist``, with the backend chosen by the device unless given.

    Contract: sets ``MASTER_ADDR MASTER_PORT WORLD_SIZE RANK LOCAL_RANK`` in ``os.environ``
    (code after it, and libraries, read them there), selects ``cuda:<local_rank>`` when CUDA
    is available, and initialises the default process group with ``env://`` unless one is
    already initialised.
    """
    problems = check_count("world_size", world_size)
    problems += check_index("rank", rank, "world_size", world_size)
    problems += [f"local_rank must be >= 0, got {local_rank}"] if local_rank < 0 else []
    if problems:
        raise UsageError(problems)
    os.environ.update(
        MASTER_ADDR=master_addr,
        MASTER_PORT=str(master_port),
        WORLD_SIZE=str(world_size),
        RANK=str(rank),
        LOCAL_RANK=str(local_rank),
    )
    return _init_group(rank, local_rank, world_size, "env://", backend, timeout)


def init(backend: str = "auto", timeout: timedelta = DEFAULT_TIMEOUT) -> DistInfo:
    """Join the process group of a worker started by a launcher (see the module docstring).

    Reads ``os.environ`` (without changing it), selects device and backend, and initialises
    the default process group unless one already is. ``backend='auto'`` takes the launcher's
    choice (``PHALANX_BACKEND``, set by ``phalanx.spawn``) when there is one, else the
    device's. Raises ``UsageError`` when no launcher is recognised or its variables are
    incomplete.
    """
    found = read_launch_env(os.environ)
    if found is None:
        raise UsageError(
            "no launcher environment found (looked for "
            f"{', '.join(lv.marker for lv in LAUNCHERS)}); hint: start the script with "
            "phalanx, torchrun, srun or mpirun, or call phalanx.setup_dist()"
        )
    for note in found.notes:
        log.warning("%s", note)  # a derived port must be visible (and overridable)
    host = f"[{found.master_addr}]" if ":" in found.master_addr else found.master_addr
    url = f"tcp://{host}:{found.master_port}"
    chosen = found.backend if backend == "auto" else backend
    return _init_group(found.rank, found.local_rank, found.world_size, url, chosen, timeout)
