"""The top record: one record per part of the engine, each handed only to the parts that
need it, and the facts about the launch itself."""

from __future__ import annotations

from dataclasses import dataclass, field

from phalanx.config.checks import ChecksConfig
from phalanx.config.logs import LogsConfig, MetricsConfig
from phalanx.config.recovery import RecoveryConfig
from phalanx.config.remote import RemoteConfig
from phalanx.config.rendezvous import RendezvousConfig
from phalanx.config.workers import WorkersConfig


@dataclass(frozen=True)
class LaunchConfig:
    workers: WorkersConfig
    rendezvous: RendezvousConfig = field(default_factory=RendezvousConfig)
    logs: LogsConfig = field(default_factory=LogsConfig)
    checks: ChecksConfig = field(default_factory=ChecksConfig)
    recovery: RecoveryConfig = field(default_factory=RecoveryConfig)
    remote: RemoteConfig = field(default_factory=RemoteConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    dry_run: bool = False
    # torchrun flags accepted (so a torchrun command line keeps working) but not applied:
    # one line each, logged when the job starts.
    not_applied: tuple[str, ...] = ()
    # What the scheduler that started phalanx said (phalanx.environments, cli.scheduler): one
    # line per fact used, naming its variable; printed at start and by --dry-run.
    derived: tuple[str, ...] = ()
