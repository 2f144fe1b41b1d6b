"""Turn parsed flags into a ``LaunchConfig``, validating everything and reporting all
problems at once: one record per part, each read by its own few lines (the workers' flags in
``worker_flags``, the host list's in ``hosts_flags``, the rendezvous's in ``rdzv_flags``), in
one fixed order, so a batch lists its problems in the order the user has always seen.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from phalanx import parsing
from phalanx.cli import preempt
from phalanx.cli.hosts_flags import remote_flags
from phalanx.cli.nproc import cuda_device_count as _cuda_device_count
from phalanx.cli.nproc import resolve_nproc
from phalanx.cli.problems import Problems
from phalanx.cli.rdzv_flags import rendezvous_flags
from phalanx.cli.scheduler import NO_DERIVATION, Derivation
from phalanx.cli.worker_flags import worker_flags
from phalanx.config import (
    ChecksConfig,
    LaunchConfig,
    LogsConfig,
    MetricsConfig,
    RecoveryConfig,
    RendezvousConfig,
)
from phalanx.errors import UsageError
from phalanx.events import metrics
from phalanx.hang.settings import HangWatch, parse_hang_watch
from phalanx.launch import Launch, check_launch
from phalanx.nodecheck.settings import Action, CheckSettings, Thresholds
from phalanx.stragglers.settings import (
    DEFAULT_FRACTION,
    DEFAULT_WINDOW_S,
    StragglerAction,
    StragglerSettings,
)
from phalanx.stragglers.settings import problems as straggler_problems

_Problems = Problems

SHUTDOWN_TIMEOUT_ENV = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"
DEFAULT_SHUTDOWN_TIMEOUT = 5.0
# torchrun's worker line prefix, a string.Template of ${role_name} ${rank} ${local_rank}.
PREFIX_TEMPLATE_ENV = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"


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
    included: ``cli.scheduler.derive``, whose facts ``ns`` already holds). The flags are read
    in one fixed order, so the batch lists the problems in the order the user has always seen."""
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
    workers = worker_flags(ns, environ, p, nproc, (monitor, shutdown))
    remote = remote_flags(ns, environ, p, nproc, derivation.given)
    standalone = bool(ns.standalone)
    nodes = RendezvousConfig(
        min_nodes=1 if standalone else min_nodes,
        max_nodes=1 if standalone else max_nodes,
        standalone=standalone,
        **rendezvous,
    )
    logs = LogsConfig(
        log_dir=Path(ns.log_dir) if ns.log_dir else None,
        **_streams(ns, p, nproc),
        log_line_prefix_template=environ.get(PREFIX_TEMPLATE_ENV) or None,
    )
    recovery = _recovery(ns, environ, p, max_restarts)
    metrics_ = _metrics(ns, p)
    checks = ChecksConfig(stall or None, _hang_watch(ns, p, stall), _node_check(ns, p), _stragglers(ns, p), bool(ns.allow_mismatch))  # fmt: skip
    config = LaunchConfig(
        workers, nodes, logs, checks, recovery, remote, metrics_,
        dry_run=bool(ns.dry_run),
        not_applied=(*rdzv_notes, *_not_applied(ns)),
        derived=derivation.lines,
    )  # fmt: skip
    return _launch(config, p)


def _recovery(
    ns: argparse.Namespace, environ: Mapping[str, str], p: _Problems, max_restarts: int
) -> RecoveryConfig:
    """The restart budget (read earlier), preemption, and the exclusion of nodes."""
    return RecoveryConfig(
        max_restarts,
        **_preemption(ns, environ, p),
        exclude_after=p.parse(
            lambda: parsing.parse_int(ns.exclude_after, "--exclude-after", minimum=0), 0
        ),
        exclude_file=_exclude_file(ns, p),
    )


def _launch(config: LaunchConfig, p: _Problems) -> Launch:
    """The launch of ``config``, or every problem found so far and the rendezvous's, at once."""
    launch, problems = check_launch(config)
    for problem in problems:
        p.add(problem)
    if p.found or launch is None:
        raise UsageError(p.found)
    return launch


def _metrics(ns: argparse.Namespace, p: _Problems) -> MetricsConfig:
    """--metrics-port and --metrics-addr; the library is looked for now (not imported), so a
    missing one is a usage error like any other, said before anything starts."""
    addr = p.parse(lambda: parsing.check_host(ns.metrics_addr, "--metrics-addr"), "127.0.0.1")
    if ns.metrics_port is None:
        return MetricsConfig(metrics_addr=addr)
    port = p.parse(lambda: parsing.parse_int(ns.metrics_port, "--metrics-port", minimum=1), None)
    if port is not None and port > 65535:
        p.add(f"--metrics-port: expected 1..65535, got {port}")
    if not metrics.available():
        p.add(f"--metrics-port needs the prometheus-client library: {metrics.METRICS_EXTRA}")
    return MetricsConfig(port, addr)


def _node_check(ns: argparse.Namespace, p: _Problems) -> CheckSettings:
    """--node-check, --node-check-thresholds, --checkpoint-dir."""
    thresholds = p.parse(lambda: Thresholds.parse(ns.node_check_thresholds or ""), Thresholds())
    checkpoints = Path(ns.checkpoint_dir) if ns.checkpoint_dir else None
    return CheckSettings(Action(ns.node_check), thresholds, checkpoints)


def _hang_watch(ns: argparse.Namespace, p: _Problems, stall: float) -> HangWatch | None:
    """--hang-watch (on by default); off where --stall-timeout replaces it."""
    default: HangWatch | None = HangWatch()
    watch = p.parse(lambda: parse_hang_watch(ns.hang_watch), default)
    if stall and watch is not None and watch != HangWatch():
        p.add("--hang-watch and --stall-timeout: give one (--stall-timeout replaces the watch)")
    return None if stall else watch


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
