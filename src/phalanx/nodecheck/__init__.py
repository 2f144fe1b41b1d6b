"""The node check before every round of a multi-node job, and ``phalanx check``.

The names below are re-exported lazily: the config imports ``nodecheck.settings`` on every
launch, and importing the package must not import the check itself (its probes, ``json``,
``statistics``, ``socket``: about 10 ms) for a job that never runs it.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from phalanx.nodecheck.round import Skipped, check_round
    from phalanx.nodecheck.settings import Action, CheckSettings, Thresholds
    from phalanx.nodecheck.verdict import Verdict, judge, table

_WHERE = {
    "Skipped": "round", "check_round": "round", "Action": "settings", "CheckSettings": "settings",
    "Thresholds": "settings", "Verdict": "verdict", "judge": "verdict", "table": "verdict",
}  # fmt: skip

__all__ = [
    "Action", "CheckSettings", "Skipped", "Thresholds", "Verdict", "check_round", "judge", "table",
]  # fmt: skip


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'phalanx.nodecheck' has no attribute {name!r}")
    value = getattr(import_module(f"phalanx.nodecheck.{_WHERE[name]}"), name)
    globals()[name] = value
    return value
