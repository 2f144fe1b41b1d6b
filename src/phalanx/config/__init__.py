"""The launch configuration: plain, frozen, validated data, one record per part of the engine
(``LaunchConfig`` composes them). argparse never gets past ``cli``."""

from __future__ import annotations

from phalanx.config.checks import ChecksConfig
from phalanx.config.launch import LaunchConfig
from phalanx.config.logs import LogsConfig, MetricsConfig
from phalanx.config.recovery import RecoveryConfig
from phalanx.config.remote import HostSlots, RemoteConfig
from phalanx.config.rendezvous import DEFAULT_RDZV_ID, RendezvousConfig, shown_run_id
from phalanx.config.workers import LaunchMode, WorkersConfig

__all__ = [
    "DEFAULT_RDZV_ID",
    "ChecksConfig",
    "HostSlots",
    "LaunchConfig",
    "LaunchMode",
    "LogsConfig",
    "MetricsConfig",
    "RecoveryConfig",
    "RemoteConfig",
    "RendezvousConfig",
    "WorkersConfig",
    "shown_run_id",
]
