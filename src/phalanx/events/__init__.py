"""The run's event log, ``<run dir>/events.jsonl``: what happened, when, on which node."""

from phalanx.events.figures import Recovery, RecoveryTracker, recovery
from phalanx.events.kinds import KINDS, SCHEMA_VERSION
from phalanx.events.log import EVENTS_FILE, EventLog, read_events
from phalanx.events.run import NODES_DIR, read_run_events

__all__ = [
    "EVENTS_FILE",
    "KINDS",
    "NODES_DIR",
    "SCHEMA_VERSION",
    "EventLog",
    "Recovery",
    "RecoveryTracker",
    "read_events",
    "read_run_events",
    "recovery",
]
