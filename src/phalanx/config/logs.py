"""What a run writes and shows: its log files, its console lines, its metrics."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class LogsConfig:
    log_dir: Path | None = None
    # Streams per local rank that go to the log file only, not to the console (torchrun's -r).
    redirects: dict[int, frozenset[str]] = field(default_factory=dict)
    local_ranks_filter: frozenset[int] | None = None
    # TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE: each console line's prefix, a string.Template of
    # ${role_name} ${rank} ${local_rank} (torchrun's); None: "[rankN]: " (plan.prefix).
    log_line_prefix_template: str | None = None
    # Lines containing any of these words are also copied to filtered_std{out,err}.log.
    duplicate_stdout_filters: tuple[str, ...] = ()
    duplicate_stderr_filters: tuple[str, ...] = ()


@dataclass(frozen=True)
class MetricsConfig:
    # --metrics-port: serve this agent's events as Prometheus metrics on metrics_addr
    # (loopback by default: the numbers and host names are nobody else's business unless
    # asked; phalanx.events.metrics). None: not served.
    metrics_port: int | None = None
    metrics_addr: str = "127.0.0.1"
