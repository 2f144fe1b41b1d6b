"""phalanx: launch and supervise distributed PyTorch training.

The in-script API is re-exported lazily so that ``import phalanx`` (and the ``phalanx``
launcher itself) does not pay for importing torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from phalanx.errors import Interrupted, JobFailed, PhalanxError, RendezvousError, UsageError

if TYPE_CHECKING:
    from phalanx.dist import DistInfo, add_dist_args, init, setup_dist
    from phalanx.inscript import spawn

__version__ = "0.1.0"

_LAZY = {
    "spawn": "phalanx.inscript",
    "add_dist_args": "phalanx.dist",
    "setup_dist": "phalanx.dist",
    "init": "phalanx.dist",
    "DistInfo": "phalanx.dist",
}

__all__ = [
    "DistInfo",
    "Interrupted",
    "JobFailed",
    "PhalanxError",
    "RendezvousError",
    "UsageError",
    "add_dist_args",
    "init",
    "setup_dist",
    "spawn",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'phalanx' has no attribute {name!r}")
