"""The flags that say what runs and how its workers are started, read into the
``WorkersConfig``."""

from __future__ import annotations

import argparse
import shutil
import signal
from collections.abc import Mapping
from pathlib import Path

from phalanx import parsing
from phalanx.cli.problems import Problems
from phalanx.config import LaunchMode, WorkersConfig

LOGS_SPECS_GROUP = "torchrun.logs_specs"

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


def worker_flags(
    ns: argparse.Namespace,
    environ: Mapping[str, str],
    p: Problems,
    nproc: int,
    seconds: tuple[float, float],
) -> WorkersConfig:
    """The program and how its workers are started and watched (``seconds``: the monitor
    interval and the shutdown timeout, read earlier with the other durations)."""
    signals, preload = _check_names(ns, p)
    owner_flags = p.parse(lambda: parse_owner_flags(ns.spawn_owner_flags), SPAWN_OWNER_FACTS)
    mode, program = _program(ns, environ, p)
    return WorkersConfig(
        program=program,
        program_args=tuple(ns.training_script_args),
        mode=mode,
        nproc_per_node=nproc,
        role=str(ns.role),
        monitor_interval=seconds[0],
        shutdown_timeout=seconds[1],
        signals_to_handle=signals,
        virtual_local_rank=bool(ns.virtual_local_rank),
        start_method=str(ns.start_method),
        warm_start=not ns.cold_start,
        preload=preload,
        keep_warm=p.parse(
            lambda: parsing.parse_float(str(ns.keep_warm), "--keep-warm", minimum=0), 0.0
        ),
        spawn_owner=bool(ns.spawn_owner),
        spawn_owner_flags=owner_flags,
    )


def _check_names(ns: argparse.Namespace, p: Problems) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """--signals-to-handle and --preload, and the torchrun flags phalanx refuses."""
    signals = tuple(s.strip().upper() for s in str(ns.signals_to_handle).split(",") if s.strip())
    for name in signals:
        if not (name.startswith("SIG") and hasattr(signal.Signals, name)):
            p.add(f"--signals-to-handle: unknown signal {name!r} (expected names like SIGTERM)")
        elif name in ("SIGKILL", "SIGSTOP"):
            p.add(f"--signals-to-handle: {name} cannot be caught by any process")
    preload = tuple(m.strip() for m in str(ns.preload).split(",") if m.strip())
    for name in preload:
        if not all(part.isidentifier() for part in name.split(".")):
            p.add(f"--preload: {name!r} is not a module name (expected e.g. numpy,pkg.mod)")
    if ns.logs_specs is not None and ns.logs_specs not in _logs_specs_names():
        # torchrun's own refusal (its _get_logs_specs_class), as a usage error.
        p.add(
            f"--logs-specs: could not find entrypoint under "
            f"'{LOGS_SPECS_GROUP}[{ns.logs_specs}]' key (registered: "
            f"{', '.join(sorted(_logs_specs_names())) or 'none'})"
        )
    if ns.event_log_handler not in {"null", "console"}:
        p.add(f"--event-log-handler: expected null or console, got {ns.event_log_handler!r}")
    return signals, preload


def _program(
    ns: argparse.Namespace, environ: Mapping[str, str], p: Problems
) -> tuple[LaunchMode, str]:
    mode = LaunchMode.SCRIPT
    if ns.run_path:
        mode = LaunchMode.RUN_PATH
    elif ns.no_python:
        mode = LaunchMode.NO_PYTHON
    elif ns.module:
        mode = LaunchMode.MODULE
    if ns.module and ns.no_python and not ns.run_path:
        p.add("-m/--module and --no-python cannot be used together")
    program = str(ns.training_script)
    if mode in (LaunchMode.SCRIPT, LaunchMode.RUN_PATH) and not Path(program).is_file():
        if Path(program).is_dir():
            p.add(f"training script {program!r} is a directory; give the script in it (a .py file)")
        else:
            p.add(f"training script not found: {program!r}")
    if mode is LaunchMode.NO_PYTHON and shutil.which(program, path=environ.get("PATH")) is None:
        p.add(f"--no-python: program {program!r} is not an executable file or on PATH")
    return mode, program


def _logs_specs_names() -> set[str]:
    """The names registered in torchrun's entry point group (torch registers ``default``);
    read from the metadata, nothing is imported (importlib.metadata only then: 19 ms)."""
    from importlib.metadata import entry_points

    return {ep.name for ep in entry_points(group=LOGS_SPECS_GROUP)}
