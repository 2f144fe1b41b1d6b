"""``phalanx.spawn``: ``torch.multiprocessing.spawn`` for programs that own their launch,
run through phalanx's own agent (the same supervision, logs, report and restarts as the CLI).
"""

from __future__ import annotations

import multiprocessing.spawn
import os
import pickle
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from phalanx.agent import Agent, configure_logging
from phalanx.cli.main import plan_rendezvous
from phalanx.config import LaunchConfig, LaunchMode
from phalanx.dist import resolve_backend
from phalanx.errors import UsageError

DEFAULT_MASTER_PORT = 12345  # TRELLIS.2's default


def spawn(
    fn: Callable[..., Any],
    args: tuple[Any, ...] = (),
    *,
    num_gpus: int,
    num_nodes: int = 1,
    node_rank: int = 0,
    master_addr: str = "localhost",
    master_port: int = DEFAULT_MASTER_PORT,
    backend: str = "auto",
    max_restarts: int = 0,
    log_dir: str | os.PathLike[str] | None = None,
    shutdown_timeout: float = 5.0,
    stall_timeout: float | None = None,
) -> None:
    """Run ``fn(local_rank, *args)`` in ``num_gpus`` processes on this node.

    Each process gets the standard environment (``RANK = node_rank * num_gpus + local_rank``,
    ``WORLD_SIZE = num_nodes * num_gpus``, ``MASTER_ADDR``, ``MASTER_PORT``, ...) and
    ``PHALANX_BACKEND`` (the resolved ``backend``) for ``phalanx.dist.init``. On a CPU-only
    machine ``num_gpus`` counts CPU worker processes. ``stall_timeout`` (seconds, off by
    default) is the CLI's ``--stall-timeout``: ranks without progress for that long are
    reported as a hang, with every rank's stack in ``log_dir``. ``fn`` and ``args`` must be picklable
    (as with ``torch.multiprocessing.spawn``). Returns when every process exited 0; raises
    ``JobFailed`` naming the root cause (after printing the report) or ``Interrupted``.
    """
    problems = [
        f"{name}: expected an integer >= {low}, got {value}"
        for name, value, low in (
            ("num_gpus", num_gpus, 1),
            ("num_nodes", num_nodes, 1),
            ("node_rank", node_rank, 0),
            ("max_restarts", max_restarts, 0),
        )
        if value < low
    ]
    if stall_timeout is not None and not 0 < stall_timeout < float("inf"):
        problems.append(f"stall_timeout: expected seconds > 0 or None, got {stall_timeout}")
    if num_nodes >= 1 and not 0 <= node_rank < num_nodes:
        problems.append(
            f"node_rank: expected 0..{num_nodes - 1} for num_nodes {num_nodes}, got {node_rank}"
        )
    if problems:
        raise UsageError(problems)
    chosen_backend = resolve_backend(backend)
    configure_logging()
    with tempfile.TemporaryDirectory(prefix="phalanx-spawn-") as scratch:
        payload = Path(scratch) / "payload.pkl"
        with open(payload, "wb") as handle:
            preparation = multiprocessing.spawn.get_preparation_data("phalanx-spawn")
            # The authkey refuses to be pickled; each worker gets its own, as a fresh process.
            preparation.pop("authkey", None)
            pickle.dump(preparation, handle)
            pickle.dump((fn, args), handle)
        config = LaunchConfig(
            program="phalanx.worker.spawn_entry",
            program_args=(str(payload),),
            mode=LaunchMode.MODULE,
            nproc_per_node=num_gpus,
            min_nodes=num_nodes,
            max_nodes=num_nodes,
            rdzv_backend="static",
            node_rank=node_rank,
            master_addr=master_addr,
            master_port=int(master_port),
            max_restarts=max_restarts,
            shutdown_timeout=shutdown_timeout,
            stall_timeout=stall_timeout,
            log_dir=Path(log_dir) if log_dir is not None else None,
        )
        env = dict(os.environ, PHALANX_BACKEND=chosen_backend)
        run_id, open_rendezvous = plan_rendezvous(config)
        Agent(config, open_rendezvous, run_id, env).run()
