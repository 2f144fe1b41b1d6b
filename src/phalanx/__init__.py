"""phalanx: launch and supervise distributed PyTorch training.

The in-script API is re-exported lazily so that ``import phalanx`` (and the ``phalanx``
launcher itself) does not pay for importing torch. ``phalanx.checkpoint`` and
``phalanx.dist`` (``from phalanx import checkpoint, dist``) are the modules of
``phalanx.inscript`` of those names.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from phalanx.errors import (
    Interrupted,
    JobFailed,
    MismatchError,
    PhalanxError,
    Preempted,
    RendezvousError,
    UsageError,
)
from phalanx.version import __version__ as __version__

if TYPE_CHECKING:
    from phalanx.inscript import checkpoint, dist
    from phalanx.inscript.dist import DistInfo, add_dist_args, init, setup_dist
    from phalanx.inscript.preempt import preempted
    from phalanx.inscript.spawn import spawn
    from phalanx.worker.progress import heartbeat, pause, step


_MODULES = {"checkpoint": "phalanx.inscript.checkpoint", "dist": "phalanx.inscript.dist"}

_LAZY = {
    "spawn": "phalanx.inscript.spawn",
    "add_dist_args": "phalanx.inscript.dist",
    "setup_dist": "phalanx.inscript.dist",
    "init": "phalanx.inscript.dist",
    "DistInfo": "phalanx.inscript.dist",
    "step": "phalanx.worker.progress",
    "heartbeat": "phalanx.worker.progress",
    "pause": "phalanx.worker.progress",
    "preempted": "phalanx.inscript.preempt",
}

__all__ = [
    "DistInfo",
    "Interrupted",
    "JobFailed",
    "MismatchError",
    "PhalanxError",
    "Preempted",
    "RendezvousError",
    "UsageError",
    "add_dist_args",
    "checkpoint",
    "dist",
    "heartbeat",
    "init",
    "pause",
    "preempted",
    "setup_dist",
    "spawn",
    "step",
]


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        module = import_module(_MODULES[name])
        globals()[name] = module
        return module
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name]), name)
        globals()[name] = value  # once: phalanx.step() in a training loop is then a plain lookup
        return value
    raise AttributeError(f"module 'phalanx' has no attribute {name!r}")
