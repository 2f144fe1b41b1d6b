"""``phalanx.spawn``: ``torch.multiprocessing.spawn`` for programs that own their launch,
run through phalanx's own agent (the same supervision, logs, report and restarts as the CLI).
"""

from __future__ import annotations

import logging
import multiprocessing.spawn
import os
import pickle
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from phalanx.agent import configure_logging
from phalanx.config import (
    ChecksConfig,
    LaunchConfig,
    LaunchMode,
    LogsConfig,
    RecoveryConfig,
    RendezvousConfig,
    WorkersConfig,
)
from phalanx.consistency.fingerprint import Target
from phalanx.errors import Interrupted, UsageError, stopped_line
from phalanx.hang.settings import HangWatch, parse_hang_watch
from phalanx.inscript.dist import resolve_backend
from phalanx.inscript.envs import BACKEND_ENV
from phalanx.launch import prepare

DEFAULT_MASTER_PORT = 12345  # TRELLIS.2's default

log = logging.getLogger("phalanx")


def _ports(
    num_nodes: int, master_port: int | str, rdzv_port: int | None
) -> tuple[int, int, list[str]]:
    """(the workers' port, the agents' store port on node 0, problems). The agents' port is
    ``rdzv_port``, else the one after ``master_port`` (before, for 65535); 0 on one node,
    which needs none. ``master_port`` may be a string, as TRELLIS.2's flag is."""
    text = str(master_port)
    worker_port = int(text) if text.isascii() and text.isdigit() else -1
    if not 0 <= worker_port < 65536:
        return 0, 0, [f"master_port: expected 1..65535 (0: any free port), got {master_port!r}"]
    if num_nodes == 1:
        return worker_port, 0, []
    if worker_port == 0:
        return 0, 0, ["master_port: 0 (any free port) needs num_nodes=1: every node must know it"]
    port = rdzv_port if rdzv_port is not None else worker_port + (1 if worker_port < 65535 else -1)
    if not 0 < port < 65536 or port == worker_port:
        return 0, 0, [f"rdzv_port: expected 1..65535, not master_port ({worker_port}), got {port}"]
    return worker_port, port, []


def _counts_problems(
    num_gpus: int, num_nodes: int, node_rank: int, max_restarts: int, stall_timeout: float | None
) -> list[str]:
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
    return problems


def _keep_warm_problems(keep_warm: float) -> list[str]:
    """``keep_warm`` as ``--keep-warm`` takes it: seconds, 0 (no service) or more."""
    if isinstance(keep_warm, int | float) and 0 <= keep_warm < float("inf"):
        return []
    return [f"keep_warm: expected seconds >= 0 (0: no warm service), got {keep_warm!r}"]


def _hang_watch(spec: str, problems: list[str]) -> tuple[HangWatch | None, list[str]]:
    """``hang_watch``'s settings, and ``problems`` with its own when it is wrong."""
    try:
        return parse_hang_watch(spec, "hang_watch"), problems
    except ValueError as exc:
        return None, [*problems, str(exc)]


def _write_payload(scratch: Path, fn: Callable[..., Any], args: tuple[Any, ...]) -> Path:
    """What each worker unpickles (``phalanx.worker.spawn_entry``): the parent's preparation
    data, as ``multiprocessing`` spawn sends it, then ``fn`` and ``args``."""
    payload = scratch / "payload.pkl"
    with open(payload, "wb") as handle:
        preparation = multiprocessing.spawn.get_preparation_data("phalanx-spawn")
        # The authkey refuses to be pickled; each worker gets its own, as a fresh process.
        preparation.pop("authkey", None)
        pickle.dump(preparation, handle)
        pickle.dump((fn, args), handle)
    return payload


def spawn(
    fn: Callable[..., Any],
    args: tuple[Any, ...] = (),
    *,
    num_gpus: int,
    num_nodes: int = 1,
    node_rank: int = 0,
    master_addr: str = "localhost",
    master_port: int | str = DEFAULT_MASTER_PORT,
    backend: str = "auto",
    max_restarts: int = 0,
    log_dir: str | os.PathLike[str] | None = None,
    shutdown_timeout: float = 5.0,
    stall_timeout: float | None = None,
    rdzv_port: int | None = None,
    allow_mismatch: bool = False,
    hang_watch: str = "on",
    keep_warm: float = 0.0,
) -> None:
    """Run ``fn(local_rank, *args)`` in ``num_gpus`` processes on this node.

    Each process gets the standard environment (``RANK = node_rank * num_gpus + local_rank``,
    ``WORLD_SIZE = num_nodes * num_gpus``, ``MASTER_ADDR``, ``MASTER_PORT``, ...) and
    ``PHALANX_BACKEND`` (the resolved ``backend``) for ``phalanx.inscript.dist.init``. On a CPU-only
    machine ``num_gpus`` counts CPU worker processes. ``stall_timeout`` (seconds, off by
    default) is the CLI's ``--stall-timeout``: ranks without progress for that long are
    reported as a hang, with every rank's stack in ``log_dir``, and the round fails at once;
    without it ``hang_watch`` (the CLI's ``--hang-watch``: ``"on"``, ``"off"`` or
    ``"floor=60,factor=5,grace=300"``) names a rank silent far past its own rhythm and fails
    the round only at ten times that bound. ``fn`` and ``args`` must be picklable
    (as with ``torch.multiprocessing.spawn``). Returns when every process exited 0; raises
    ``JobFailed`` naming the root cause (after printing the report) or ``Interrupted`` (after
    printing one line; uncaught, it ends the program with its exit code, 143 for SIGTERM and
    130 for SIGINT, as a ``SystemExit`` does).

    Ports: ``master_port`` is the workers' -- ``MASTER_PORT`` in every round, restarts
    included, so a ``fn`` that calls ``setup_dist(..., master_addr, master_port)`` with the
    values it was given works unchanged. With ``num_nodes > 1`` the nodes' agents meet on
    another port of node 0, ``rdzv_port`` (default ``master_port + 1``, logged at start);
    both must be open between the nodes. ``master_port=0`` (one node only): a free port,
    a new one each round.

    With ``num_nodes > 1`` the nodes compare their code at the rendezvous, as the CLI's do
    (the program's main script, ``sys.argv[0]``, and the files its arguments name): a
    difference raises ``MismatchError`` (exit code 2) on every node before any process
    starts, unless ``allow_mismatch`` (then it is a warning).

    ``keep_warm`` (seconds; the CLI's ``--keep-warm``): the processes fork from this user's
    warm service, which stays that long after its last job ended, so that the program's next
    ``spawn`` (or launch) forks from it without importing torch again; 0 (the default): from
    a template of this call's own, as without it (docs/how-to/warm-service.md).
    """
    worker_port, agents_port, problems = _ports(num_nodes, master_port, rdzv_port)
    problems = (
        _counts_problems(num_gpus, num_nodes, node_rank, max_restarts, stall_timeout) + problems
    )
    watch, problems = _hang_watch(hang_watch, problems + _keep_warm_problems(keep_warm))
    if problems:
        raise UsageError(problems)
    chosen_backend = resolve_backend(backend)
    configure_logging()
    with tempfile.TemporaryDirectory(prefix="phalanx-spawn-") as scratch:
        payload = _write_payload(Path(scratch), fn, args)
        config = LaunchConfig(
            _workers(payload, num_gpus, shutdown_timeout, float(keep_warm)),
            _nodes(num_nodes, node_rank, master_addr, agents_port, worker_port),
            LogsConfig(log_dir=Path(log_dir) if log_dir is not None else None),
            ChecksConfig(stall_timeout, watch, allow_mismatch=allow_mismatch),
            RecoveryConfig(max_restarts=max_restarts),
        )
        env = {**os.environ, BACKEND_ENV: chosen_backend}
        if num_nodes > 1:
            log.info(
                "phalanx.spawn: the agents meet at %s:%d (rdzv_port); the workers' store is "
                "%s:%d (master_port)", master_addr, agents_port, master_addr, worker_port,
            )  # fmt: skip
        _run(config, env)


def _workers(
    payload: Path, num_gpus: int, shutdown_timeout: float, keep_warm: float
) -> WorkersConfig:
    """Each worker runs phalanx's entry point, which unpickles ``fn`` from ``payload``."""
    return WorkersConfig(
        program="phalanx.worker.spawn_entry",
        program_args=(str(payload),),
        mode=LaunchMode.MODULE,
        nproc_per_node=num_gpus,
        shutdown_timeout=shutdown_timeout,
        keep_warm=keep_warm,
    )


def _nodes(
    num_nodes: int, node_rank: int, master_addr: str, agents_port: int, worker_port: int
) -> RendezvousConfig:
    """A static rendezvous: the agents meet on ``agents_port`` when there is one (several
    nodes), else on ``worker_port``; the workers' store is always on ``worker_port`` (0: a
    free one per round)."""
    return RendezvousConfig(
        min_nodes=num_nodes,
        max_nodes=num_nodes,
        rdzv_backend="static",
        node_rank=node_rank,
        master_addr=master_addr,
        master_port=agents_port or worker_port,
        worker_port=worker_port or None,
    )


def _run(config: LaunchConfig, env: dict[str, str]) -> None:
    """The agent for ``config``, as this program's: its code is compared, not its arguments."""
    # The workers run phalanx's entry point; the code that differs would be the program's.
    # Its nodes' command lines differ by design (--node_rank): the arguments are not compared.
    target = Target("script", sys.argv[0], tuple(sys.argv[1:]), per_node_args=True)
    launch = prepare(config, target)
    try:
        launch.run(env)
    except Interrupted as exc:
        # The CLI's one line; the exception (a SystemExit too) then ends an uncaught
        # program with its code, 143 or 130, and no traceback.
        print(f"phalanx: {stopped_line(exc)}", file=sys.stderr, flush=True)
        raise
