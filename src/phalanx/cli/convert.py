"""Turn parsed flags into a ``LaunchConfig``, validating everything and reporting all
problems at once.

About 380 lines: one flag table's worth of conversions, each a few lines, kept together so a
flag's parsing and its problems are found in one place.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import signal
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from phalanx import parsing
from phalanx.check_settings import Action, CheckSettings, Thresholds
from phalanx.cli import preempt
from phalanx.cli.nproc import cuda_device_count as _cuda_device_count
from phalanx.cli.nproc import resolve_nproc
from phalanx.cli.problems import Problems
from phalanx.cli.rdzv_flags import rendezvous_flags
from phalanx.cli.scheduler import NO_DERIVATION, Derivation
from phalanx.config import HostSlots, LaunchConfig, LaunchMode
from phalanx.errors import UsageError
from phalanx.events import metrics
from phalanx.hosts.hostfile import parse_hosts, read_hostfile
from phalanx.hosts.remote_env import forwarded_env, read_env_file
from phalanx.launch import Launch, check_launch
from phalanx.stragglers.settings import (
    DEFAULT_FRACTION,
    DEFAULT_WINDOW_S,
    StragglerAction,
    StragglerSettings,
)
from phalanx.stragglers.settings import problems as straggler_problems

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


_Problems = Problems

SHUTDOWN_TIMEOUT_ENV = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"
DEFAULT_SHUTDOWN_TIMEOUT = 5.0
# torchrun's worker line prefix, a string.Template of ${role_name} ${rank} ${local_rank}.
PREFIX_TEMPLATE_ENV = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"
LOGS_SPECS_GROUP = "torchrun.logs_specs"


def _shutdown_timeout(text: str | None, environ: Mapping[str, str]) -> float:
    """--shutdown-timeout; not given: ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` as torchrun reads
    it, else 5 (torchrun: 30; phalanx stops a failed group sooner, a deliberate difference)."""
    if text is not None:
        return parsing.parse_float(text, "--shutdown-timeout", minimum=0)
    if (env := environ.get(SHUTDOWN_TIMEOUT_ENV)) is not None:
        return parsing.parse_float(env, SHUTDOWN_TIMEOUT_ENV, minimum=0)
    return DEFAULT_SHUTDOWN_TIMEOUT


def _seconds(
    ns: argparse.Namespace, environ: Mapping[str, str], p: _Problems
) -> tuple[float, float, float]:
    """--monitor-interval, --shutdown-timeout, --stall-timeout (0: off)."""
    monitor = p.parse(
        lambda: parsing.parse_float(ns.monitor_interval, "--monitor-interval", minimum=0.001), 0.1
    )
    shutdown = p.parse(lambda: _shutdown_timeout(ns.shutdown_timeout, environ), 5.0)
    stall = p.parse(
        lambda: parsing.parse_float(ns.stall_timeout, "--stall-timeout", minimum=0), 0.0
    )
    if stall and ns.spawn_owner:
        p.add(
            "--stall-timeout does not apply to --spawn-owner: its workers are its own "
            "children, whose progress phalanx cannot see"
        )
    return monitor, shutdown, stall


def _exclude_file(ns: argparse.Namespace, p: _Problems) -> Path | None:
    """--exclude-file: a file (made when the first exclusion is written), never a folder."""
    if not ns.exclude_file:
        return None
    path = Path(ns.exclude_file)
    if path.is_dir():
        p.add(f"--exclude-file {path}: a directory, expected a file (e.g. {path}/excluded.jsonl)")
    return path


def _check_names(ns: argparse.Namespace, p: _Problems) -> tuple[tuple[str, ...], tuple[str, ...]]:
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


def _preemption(ns: argparse.Namespace, environ: Mapping[str, str], p: _Problems) -> dict[str, Any]:
    """--preempt-signals (default from the environment: ``cli.preempt``), --preempt-grace,
    --requeue."""
    no_signals: tuple[str, ...] = ()
    scheduler = str(ns.scheduler)
    signals = p.parse(
        lambda: preempt.parse_signals(ns.preempt_signals, environ, scheduler), no_signals
    )
    grace = p.parse(lambda: preempt.parse_grace(ns.preempt_grace), preempt.DEFAULT_GRACE)
    if ns.requeue and not signals:
        p.add("--requeue needs preemption signals (--preempt-signals SIG,...; none are set)")
    return {"preempt_signals": signals, "preempt_grace": grace, "requeue": bool(ns.requeue)}


def _program(
    ns: argparse.Namespace, environ: Mapping[str, str], p: _Problems
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


def _streams(ns: argparse.Namespace, p: _Problems, nproc: int) -> dict[str, Any]:
    """Where each rank's output goes: --redirects, --tee, --local-ranks-filter, filters."""
    no_streams: dict[int, frozenset[str]] = {}
    redirects = p.parse(
        lambda: parsing.parse_std_spec(ns.redirects, "--redirects", nproc), no_streams
    )
    tee = p.parse(lambda: parsing.parse_std_spec(ns.tee, "--tee", nproc), no_streams)
    # torchrun's rule: a teed stream is shown on the console even when it is also redirected.
    redirects = {rank: s - tee.get(rank, frozenset()) for rank, s in redirects.items()}
    ranks_filter = None
    if str(ns.local_ranks_filter).strip():
        ranks_filter = p.parse(
            lambda: parsing.parse_rank_list(ns.local_ranks_filter, "--local-ranks-filter"), None
        )
    return {
        "redirects": {rank: streams for rank, streams in redirects.items() if streams},
        "local_ranks_filter": ranks_filter,
        "duplicate_stdout_filters": parsing.parse_filter_words(ns.duplicate_stdout_filters),
        "duplicate_stderr_filters": parsing.parse_filter_words(ns.duplicate_stderr_filters),
    }


def to_launch(
    ns: argparse.Namespace,
    environ: Mapping[str, str],
    cuda_device_count: Callable[[], int] = _cuda_device_count,
    derivation: Derivation = NO_DERIVATION,
) -> Launch:
    """The launch (its config checked, its rendezvous checked once: ``launch.check_launch``),
    or ``UsageError`` with every problem of the command line in one batch (the scheduler's
    included: ``cli.scheduler.derive``, whose facts ``ns`` already holds)."""
    p = _Problems()
    for problem in derivation.problems:
        p.add(problem)
    nproc = p.parse(lambda: resolve_nproc(ns.nproc_per_node, cuda_device_count), 1)
    min_nodes, max_nodes = p.parse(lambda: parsing.parse_nnodes(ns.nnodes), (1, 1))
    max_restarts = p.parse(
        lambda: parsing.parse_int(ns.max_restarts, "--max-restarts", minimum=0), 0
    )
    monitor, shutdown, stall = _seconds(ns, environ, p)
    rendezvous, rdzv_notes = rendezvous_flags(ns, p, max_nodes, derivation.given)
    signals, preload = _check_names(ns, p)
    owner_flags = p.parse(lambda: parse_owner_flags(ns.spawn_owner_flags), SPAWN_OWNER_FACTS)
    mode, program = _program(ns, environ, p)
    hosts = _hosts(ns, environ, p, nproc, derivation.given)
    standalone = bool(ns.standalone)
    config = LaunchConfig(
        program=program,
        program_args=tuple(ns.training_script_args),
        mode=mode,
        nproc_per_node=nproc,
        min_nodes=1 if standalone else min_nodes,
        max_nodes=1 if standalone else max_nodes,
        standalone=standalone,
        **rendezvous,
        max_restarts=max_restarts,
        monitor_interval=monitor,
        shutdown_timeout=shutdown,
        role=str(ns.role),
        log_dir=Path(ns.log_dir) if ns.log_dir else None,
        **_streams(ns, p, nproc),
        log_line_prefix_template=environ.get(PREFIX_TEMPLATE_ENV) or None,
        signals_to_handle=signals,
        **_preemption(ns, environ, p),
        virtual_local_rank=bool(ns.virtual_local_rank),
        start_method=str(ns.start_method),
        dry_run=bool(ns.dry_run),
        spawn_owner=bool(ns.spawn_owner),
        spawn_owner_flags=owner_flags,
        warm_start=not ns.cold_start,
        preload=preload,
        stall_timeout=stall or None,
        exclude_after=p.parse(
            lambda: parsing.parse_int(ns.exclude_after, "--exclude-after", minimum=0), 0
        ),
        exclude_file=_exclude_file(ns, p),
        allow_mismatch=bool(ns.allow_mismatch),
        not_applied=(*rdzv_notes, *_not_applied(ns)),
        **_metrics(ns, p),
        node_check=_node_check(ns, p), stragglers=_stragglers(ns, p),
        derived=derivation.lines,
        **hosts,
    )
    return _launch(config, p)


def _launch(config: LaunchConfig, p: _Problems) -> Launch:
    """The launch of ``config``, or every problem found so far and the rendezvous's, at once."""
    launch, problems = check_launch(config)
    for problem in problems:
        p.add(problem)
    if p.found or launch is None:
        raise UsageError(p.found)
    return launch


def _hosts(
    ns: argparse.Namespace,
    environ: Mapping[str, str],
    p: _Problems,
    nproc: int,
    given: Mapping[str, str],
) -> dict[str, Any]:
    """--hosts/--hostfile and what goes with them (nothing when neither is given). ``given``:
    where each flag was set, so a refused one that came from ``PET_<FLAG>`` names it."""
    if ns.hosts is None and ns.hostfile is None:
        for flag, value in (("--ssh-config", ns.ssh_config), ("--env-file", ns.env_file)):
            if value is not None:
                p.add(f"{flag} applies only with --hosts or --hostfile")
        if ns.env:
            p.add("--env applies only with --hosts or --hostfile")
        return {}
    if ns.hosts is not None and ns.hostfile is not None:
        p.add("--hosts and --hostfile: give one of them")
    for refused, dest in (
        (ns.standalone, "standalone"),
        (str(ns.node_rank) != "0", "node_rank"),
        (ns.local_addr is not None, "local_addr"),
        ("rdzv_backend" in given, "rdzv_backend"),
    ):
        if refused:
            where = given.get(dest, f"PET_{dest.upper()}")
            came = "" if where == "the command line" else f" (it came from {where})"
            flag = "--" + dest.replace("_", "-")
            p.add(f"{flag} cannot be used with --hosts/--hostfile: the host list sets it{came}")
    no_hosts: tuple[HostSlots, ...] = ()
    if ns.hosts is not None:
        hosts = p.parse(lambda: parse_hosts(ns.hosts, nproc), no_hosts)
    else:
        hosts = p.parse(lambda: read_hostfile(Path(ns.hostfile), nproc), no_hosts)
    host_nodes: tuple[int, int] | None = None
    if "nnodes" in given:  # the members; the hosts started beyond MAX wait as spares
        with contextlib.suppress(ValueError):  # a bad value: said once, by _job's own parse
            host_nodes = parsing.parse_nnodes(ns.nnodes)
        if host_nodes is not None and hosts and host_nodes[0] > len(hosts):
            p.add(f"--nnodes {ns.nnodes}: at least {host_nodes[0]} nodes, but the host list "
                  f"has {len(hosts)}")  # fmt: skip
    ssh_config = Path(ns.ssh_config) if ns.ssh_config is not None else None
    if ssh_config is not None and not ssh_config.is_file():
        p.add(f"--ssh-config: no such file: {ssh_config}")
    entries: list[tuple[str, str | None]] = []
    if ns.env_file is not None:
        entries = p.parse(lambda: read_env_file(Path(ns.env_file)), entries)
    no_env: dict[str, str] = {}
    env = p.parse(lambda: forwarded_env(environ, ns.env, entries), no_env)
    return {"hosts": hosts, "host_nodes": host_nodes, "ssh_config": ssh_config,
            "forward_env": tuple(env.items())}  # fmt: skip


def _metrics(ns: argparse.Namespace, p: _Problems) -> dict[str, Any]:
    """--metrics-port and --metrics-addr; the library is looked for now (not imported), so a
    missing one is a usage error like any other, said before anything starts."""
    addr = p.parse(lambda: parsing.check_host(ns.metrics_addr, "--metrics-addr"), "127.0.0.1")
    if ns.metrics_port is None:
        return {"metrics_addr": addr}
    port = p.parse(lambda: parsing.parse_int(ns.metrics_port, "--metrics-port", minimum=1), None)
    if port is not None and port > 65535:
        p.add(f"--metrics-port: expected 1..65535, got {port}")
    if not metrics.available():
        p.add(f"--metrics-port needs the prometheus-client library: {metrics.METRICS_EXTRA}")
    return {"metrics_port": port, "metrics_addr": addr}


def _node_check(ns: argparse.Namespace, p: _Problems) -> CheckSettings:
    """--node-check, --node-check-thresholds, --checkpoint-dir."""
    thresholds = p.parse(lambda: Thresholds.parse(ns.node_check_thresholds or ""), Thresholds())
    checkpoints = Path(ns.checkpoint_dir) if ns.checkpoint_dir else None
    return CheckSettings(Action(ns.node_check), thresholds, checkpoints)


def _stragglers(ns: argparse.Namespace, p: _Problems) -> StragglerSettings:
    """--straggler-action, --straggler-fraction, --straggler-window."""
    fraction = p.parse(
        lambda: parsing.parse_float(ns.straggler_fraction, "--straggler-fraction"), DEFAULT_FRACTION
    )
    window = p.parse(
        lambda: parsing.parse_float(ns.straggler_window, "--straggler-window"), DEFAULT_WINDOW_S
    )
    for problem in straggler_problems(fraction, window):
        p.add(problem)
    return StragglerSettings(StragglerAction(ns.straggler_action), fraction, window)


def _logs_specs_names() -> set[str]:
    """The names registered in torchrun's entry point group (torch registers ``default``);
    read from the metadata, nothing is imported."""
    return {ep.name for ep in entry_points(group=LOGS_SPECS_GROUP)}


def _not_applied(ns: argparse.Namespace) -> tuple[str, ...]:
    """What a torchrun command line asks that phalanx accepts without doing, said at start."""
    notes = []
    if ns.logs_specs not in (None, "default"):
        notes.append(
            f"--logs-specs {ns.logs_specs} is not applied: phalanx writes its own logs "
            "(--log-dir, --redirects, --tee, --local-ranks-filter)"
        )
    if ns.numa_binding:
        notes.append(
            f"--numa-binding {ns.numa_binding} is not applied: phalanx does not bind workers to "
            "their GPU's NUMA node; wrap the program with numactl to bind it"
        )
    return tuple(notes)


def to_config(
    ns: argparse.Namespace,
    environ: Mapping[str, str],
    cuda_device_count: Callable[[], int] = _cuda_device_count,
    derivation: Derivation = NO_DERIVATION,
) -> LaunchConfig:
    """``to_launch``'s config (the flags' tests read only the config)."""
    return to_launch(ns, environ, cuda_device_count, derivation).config
