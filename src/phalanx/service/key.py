"""What makes a warm service fit a launch: its key, a digest of everything the service's
imports could have read.

Two launches share a service only when their keys are equal; a launch whose key has no
service starts one, so services of different keys coexist (each ends when idle). The key
covers:

- the interpreter (its real path and version) and phalanx's version;
- the launch's nice value and hard resource limits (a service cannot give a worker a higher
  priority or limit than its own without privilege);
- the preload list, in order;
- the environment variables that act while torch and the preload modules are imported
  (``service_env``: OpenMP and BLAS thread settings, ``LD_*``, ``PYTHON*``, torch's and
  CUDA's own, locale, ``HOME`` -- the user site -- and ``PATH``); the service is started
  with these and nothing else, so no other job's variables are ever in it;
- what is installed: every ``sys.path`` directory's mtime and its ``*.dist-info``,
  ``*.egg-info``, ``*.egg-link`` and ``*.pth`` entries with theirs (an install, upgrade or
  removal changes them);
- the source of every preloaded module that is not an installed distribution (your own
  package, an editable install, phalanx itself from a checkout): each ``.py`` file's path,
  size and mtime.

A key's *lineage* leaves out what is installed and the sources: a service of the launch's
lineage under another key is stale, and the launch that starts the new one stops it.

``CUDA_VISIBLE_DEVICES`` is not in the key: CUDA reads it when it initializes, in the
worker, after the fork (the service refuses to serve if its imports initialized CUDA).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import resource
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from phalanx.service.job import LIMITS
from phalanx.version import __version__

KEYED_PREFIXES = (
    "PYTHON", "OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_", "GOTO", "BLIS_", "VECLIB_",
    "NUMEXPR_", "LD_", "MALLOC_", "GLIBC_", "TORCH", "PYTORCH_", "CUDA_", "NVIDIA_", "HIP_",
    "ROCR_", "HSA_", "XLA_", "LC_",
)  # fmt: skip
KEYED_NAMES = frozenset({"HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "PATH", "VIRTUAL_ENV"})
NOT_KEYED = frozenset({"CUDA_VISIBLE_DEVICES"})  # read at CUDA's initialization, after the fork
INSTALLED = (".dist-info", ".egg-info", ".egg-link", ".pth")
SITE_DIRS = ("site-packages", "dist-packages")


def keyed(name: str) -> bool:
    return name not in NOT_KEYED and (name in KEYED_NAMES or name.startswith(KEYED_PREFIXES))


def service_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``env`` that a service is keyed on, and started with."""
    return {name: value for name, value in sorted(env.items()) if keyed(name)}


def installed(path_entries: Iterable[str]) -> list[object]:
    """What is installed on ``sys.path``: each directory's mtime and its distributions'."""
    found: list[object] = []
    for entry in path_entries:
        if not entry or not os.path.isdir(entry):
            continue  # '' is the working directory: the user's, imported fresh in the worker
        try:
            with os.scandir(entry) as listing:
                names = sorted(
                    (e.name, e.stat(follow_symlinks=False).st_mtime_ns)
                    for e in listing
                    if e.name.endswith(INSTALLED)
                )
            found.append([entry, os.stat(entry).st_mtime_ns, names])
        except OSError:
            found.append([entry, None])
    return found


def sources(modules: Iterable[str], cwd: str) -> list[object]:
    """The ``.py`` files (path, size, mtime) of the modules not installed in a site directory.
    Only the top-level name is looked up: finding ``a.b`` would import ``a``."""
    found: list[object] = []
    for name in modules:
        top = name.partition(".")[0]
        sys.path.insert(0, cwd)  # where the service looks for them too (``server.preload``)
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            spec = None
        finally:
            sys.path.remove(cwd)
        if spec is None or spec.origin in (None, "built-in", "frozen"):
            found.append([name, None])
            continue
        locations = list(spec.submodule_search_locations or [])
        roots = locations or [str(spec.origin)]
        if any(part in SITE_DIRS for root in roots for part in Path(root).parts):
            found.append([name, roots])  # covered by ``installed``
            continue
        found.append([name, roots, _tree(roots)])
    return found


def _tree(roots: list[str]) -> list[object]:
    files: list[object] = []
    for root in roots:
        if os.path.isfile(root):
            stat = os.stat(root)
            files.append([root, stat.st_size, stat.st_mtime_ns])
            continue
        for folder, dirs, names in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(names):
                if name.endswith((".py", ".so", ".pth")):
                    stat = os.stat(os.path.join(folder, name))
                    files.append([os.path.join(folder, name), stat.st_size, stat.st_mtime_ns])
    return files


def _path() -> list[str]:
    # Without this launcher's own first entry (the ``phalanx`` command's directory, or the
    # working directory under ``python -m phalanx``): the service and its workers start with
    # ``isolated_main``, which drops it, so it must not make two launches' keys differ.
    return sys.path if getattr(sys.flags, "safe_path", False) else sys.path[1:]


def _digest(described: object) -> str:
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:24]


def service_key(env: Mapping[str, str], preload: tuple[str, ...], cwd: str) -> tuple[str, str]:
    """The key of the service a launch with this template environment and preload list may
    use (hex, 24 digits: the socket's name), and its lineage: the same without what is
    installed and the sources. A service of the same lineage and another key is stale (a
    package or a preloaded module changed since it started): a launch that starts the new
    one tells it to stop."""
    lineage = {
        "python": os.path.realpath(sys.executable),
        "preload": list(preload),
        "env": service_env(env),
        # What a service started by one launch could not give another without privilege
        # (``job.refusal``): a service per priority and per set of hard limits, so that one
        # started under ``nice`` or a lower ``ulimit -H`` never turns other launches away.
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
        "hard_limits": {name: resource.getrlimit(number)[1] for name, number in LIMITS.items()},
    }
    described = {
        **lineage,
        "version": sys.version,
        "phalanx": __version__,
        "installed": installed(p for p in _path() if os.path.abspath(p) != cwd),
        "sources": sources(("phalanx", "torch", *preload), cwd),
    }
    return _digest(described), _digest(lineage)
