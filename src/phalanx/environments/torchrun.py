"""torchrun, phalanx and ``phalanx.spawn``: the worker environment they all set.

Their workers get ``RANK``/``LOCAL_RANK``/``WORLD_SIZE`` and ``MASTER_ADDR``/``MASTER_PORT``
(so no default is derived). torchrun's ``PET_<FLAG>`` variables, which Kubeflow's pods also
set, are every flag's default in the parser (``cli.parser``), not facts read here.
"""

from __future__ import annotations

from phalanx.environments.facts import LauncherVars, no_default

LAUNCHER = LauncherVars(
    "env", "RANK", "RANK", "LOCAL_RANK", "WORLD_SIZE", no_default, no_default,
    "phalanx, torchrun and phalanx.spawn always set them",
)  # fmt: skip
