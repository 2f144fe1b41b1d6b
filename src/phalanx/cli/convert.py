"""Turn parsed flags into a ``LaunchConfig``, validating everything and reporting all
problems at once."""

from __future__ import annotations

import argparse
import math
import os
import shutil
import signal
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from phalanx import parsing
from phalanx.config import LaunchConfig, LaunchMode
from phalanx.errors import UsageError

T = TypeVar("T")

KNOWN_BACKENDS = ("c10d", "etcd", "etcd-v2", "static")


# The facts a spawn-owner process is told, with TRELLIS.2's flag names by default.
SPAWN_OWNER_FACTS: tuple[tuple[str, str], ...] = tuple(
    (fact, f"--{fact}")
    for fact in ("num_nodes", "node_rank", "num_gpus", "master_addr", "master_port")
)


def parse_owner_flags(text: str) -> tuple[tuple[str, str], ...]:
    """``"num_gpus=--gpus"`` -> the default table with that flag renamed."""
    renamed = parsing.parse_kv_list(text, "--spawn-owner-flags")
    known = dict(SPAWN_OWNER_FACTS)
    unknown = sorted(set(renamed) - set(known))
    if unknown:
        raise ValueError(
            f"--spawn-owner-flags: unknown fact(s) {', '.join(unknown)}; known: {', '.join(known)}"
        )
    return tuple((fact, renamed.get(fact, flag)) for fact, flag in SPAWN_OWNER_FACTS)


def resolve_nproc(text: str, cuda_device_count: Callable[[], int]) -> int:
    """``N``, ``auto`` (GPUs if any, else CPUs), ``cpu`` or ``gpu``, as torchrun reads it."""
    value = str(text).strip().lower()
    if value == "cpu":
        return os.cpu_count() or 1
    if value in {"gpu", "auto"}:
        count = cuda_device_count()
        if count > 0:
            return count
        if value == "gpu":
            raise ValueError("--nproc-per-node gpu: no CUDA device is visible")
        return os.cpu_count() or 1
    return parsing.parse_int(text, "--nproc-per-node", minimum=1)


def _cuda_device_count() -> int:
    import torch  # imported only for auto/gpu: the launcher itself does not need torch

    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def to_config(
    ns: argparse.Namespace,
    environ: Mapping[str, str],
    cuda_device_count: Callable[[], int] = _cuda_device_count,
) -> LaunchConfig:
    problems: list[str] = []

    def check(parse: Callable[[], T], fallback: T) -> T:
        try:
            return parse()
        except ValueError as exc:
            problems.append(str(exc))
            return fallback

    nproc = check(lambda: resolve_nproc(ns.nproc_per_node, cuda_device_count), 1)
    min_nodes, max_nodes = check(lambda: parsing.parse_nnodes(ns.nnodes), (1, 1))
    max_restarts = check(lambda: parsing.parse_int(ns.max_restarts, "--max-restarts", minimum=0), 0)
    monitor = check(
        lambda: parsing.parse_float(ns.monitor_interval, "--monitor-interval", minimum=0.001), 0.1
    )
    shutdown = check(
        lambda: parsing.parse_float(ns.shutdown_timeout, "--shutdown-timeout", minimum=0), 5.0
    )
    stall = check(lambda: parsing.parse_float(ns.stall_timeout, "--stall-timeout", minimum=0), 0.0)
    if not math.isfinite(stall):
        problems.append(f"--stall-timeout: expected a number of seconds, got {ns.stall_timeout!r}")
        stall = 0.0
    if stall and ns.spawn_owner:
        problems.append(
            "--stall-timeout does not apply to --spawn-owner: its workers are its own "
            "children, whose progress phalanx cannot see"
        )
    node_rank = check(lambda: parsing.parse_int(ns.node_rank, "--node-rank", minimum=0), 0)
    master_port = check(
        lambda: parsing.parse_int(ns.master_port, "--master-port", minimum=0), 29500
    )
    if not 0 <= master_port <= 65535:
        problems.append(f"--master-port: expected 0..65535, got {master_port}")
    no_conf: dict[str, str] = {}
    no_streams: dict[int, frozenset[str]] = {}
    rdzv_conf = check(lambda: parsing.parse_kv_list(ns.rdzv_conf, "--rdzv-conf"), no_conf)
    redirects = check(
        lambda: parsing.parse_std_spec(ns.redirects, "--redirects", nproc), no_streams
    )
    check(lambda: parsing.parse_std_spec(ns.tee, "--tee", nproc), no_streams)
    ranks_filter = None
    if str(ns.local_ranks_filter).strip():
        ranks_filter = check(
            lambda: parsing.parse_rank_list(ns.local_ranks_filter, "--local-ranks-filter"), None
        )
    backend = str(ns.rdzv_backend).strip()
    # etcd takes a list of endpoints and http(s):// URLs; each multi-node backend checks its
    # own endpoint in rendezvous.registry.spec_problems.
    if ns.rdzv_endpoint and backend not in ("etcd", "etcd-v2"):
        check(lambda: parsing.parse_endpoint(ns.rdzv_endpoint), None)
    if backend not in KNOWN_BACKENDS:
        problems.append(
            f"--rdzv-backend: unknown backend {backend!r}; known: {', '.join(KNOWN_BACKENDS)}"
        )
    if node_rank >= max_nodes and backend == "static" and not ns.standalone:
        problems.append(
            f"--node-rank: expected 0..{max_nodes - 1} for --nnodes {ns.nnodes}, got {node_rank}"
        )
    signals = tuple(s.strip().upper() for s in str(ns.signals_to_handle).split(",") if s.strip())
    for name in signals:
        if not (name.startswith("SIG") and hasattr(signal.Signals, name)):
            problems.append(
                f"--signals-to-handle: unknown signal {name!r} (expected names like SIGTERM)"
            )
    if ns.logs_specs:
        problems.append(
            "--logs-specs: custom torchrun LogsSpecs plugins are not supported by phalanx; "
            "use --log-dir, --redirects and --local-ranks-filter"
        )
    if ns.event_log_handler not in {"null", "console"}:
        problems.append(
            f"--event-log-handler: expected null or console, got {ns.event_log_handler!r}"
        )

    owner_flags = check(lambda: parse_owner_flags(ns.spawn_owner_flags), SPAWN_OWNER_FACTS)
    preload = tuple(m.strip() for m in str(ns.preload).split(",") if m.strip())
    for name in preload:
        if not all(part.isidentifier() for part in name.split(".")):
            problems.append(
                f"--preload: {name!r} is not a module name (expected e.g. numpy,pkg.mod)"
            )

    mode = LaunchMode.SCRIPT
    if ns.run_path:
        mode = LaunchMode.RUN_PATH
    elif ns.no_python:
        mode = LaunchMode.NO_PYTHON
    elif ns.module:
        mode = LaunchMode.MODULE
    if ns.module and ns.no_python and not ns.run_path:
        problems.append("-m/--module and --no-python cannot be used together")
    program = str(ns.training_script)
    if mode in (LaunchMode.SCRIPT, LaunchMode.RUN_PATH) and not Path(program).is_file():
        problems.append(f"training script not found: {program!r}")
    if mode is LaunchMode.NO_PYTHON and shutil.which(program, path=environ.get("PATH")) is None:
        problems.append(f"--no-python: program {program!r} is not an executable file or on PATH")

    if problems:
        raise UsageError(problems)
    standalone = bool(ns.standalone)
    return LaunchConfig(
        program=program,
        program_args=tuple(ns.training_script_args),
        mode=mode,
        nproc_per_node=nproc,
        min_nodes=1 if standalone else min_nodes,
        max_nodes=1 if standalone else max_nodes,
        standalone=standalone,
        rdzv_backend=backend,
        rdzv_endpoint=str(ns.rdzv_endpoint),
        rdzv_id=str(ns.rdzv_id),
        rdzv_conf=tuple(sorted(rdzv_conf.items())),
        node_rank=node_rank,
        master_addr=str(ns.master_addr),
        master_port=master_port,
        local_addr=ns.local_addr,
        max_restarts=max_restarts,
        monitor_interval=monitor,
        shutdown_timeout=shutdown,
        role=str(ns.role),
        log_dir=Path(ns.log_dir) if ns.log_dir else None,
        redirects={rank: streams for rank, streams in redirects.items() if streams},
        local_ranks_filter=ranks_filter,
        duplicate_stdout_filters=parsing.parse_filter_words(ns.duplicate_stdout_filters),
        duplicate_stderr_filters=parsing.parse_filter_words(ns.duplicate_stderr_filters),
        signals_to_handle=signals,
        virtual_local_rank=bool(ns.virtual_local_rank),
        start_method=str(ns.start_method),
        dry_run=bool(ns.dry_run),
        spawn_owner=bool(ns.spawn_owner),
        spawn_owner_flags=owner_flags,
        warm_start=not ns.cold_start,
        preload=preload,
        stall_timeout=stall or None,
        not_applied=_not_applied(ns),
    )


def _not_applied(ns: argparse.Namespace) -> tuple[str, ...]:
    """What a torchrun command line asks that phalanx accepts without doing, said at start."""
    notes = []
    if ns.numa_binding:
        notes.append(
            f"--numa-binding {ns.numa_binding} is not applied: phalanx does not bind workers to "
            "their GPU's NUMA node; wrap the program with numactl to bind it"
        )
    return tuple(notes)
