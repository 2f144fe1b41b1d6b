"""The rendezvous backends by name, and the one entry point the launcher calls.

============  ================================================================================
``c10d``      dynamic (MIN:MAX) on the agent store hosted by one agent (``c10d``)
``static``    fixed node ranks; node 0 hosts the store at --master-addr:--master-port
``etcd``      dynamic on etcd v3 (``etcd``); ``etcd-v2`` is torchrun's name, same backend
============  ================================================================================

Each backend is a module of ``phalanx.rendezvous.backends`` with a ``BACKEND``, imported on
first use, so the launcher never imports etcd's client unless the job uses it.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from phalanx.errors import RendezvousError, UsageError
from phalanx.rendezvous.api import RendezvousHandler
from phalanx.rendezvous.dynamic.keys import check_run_id
from phalanx.rendezvous.fencing import timing_problem
from phalanx.rendezvous.settings import SETTINGS_KEYS, RendezvousSettings, settings_problems
from phalanx.rendezvous.spec import Backend, RendezvousSpec
from phalanx.rendezvous.stores.base import StoreUnavailable

# name -> its module in phalanx.rendezvous.backends
BACKENDS: dict[str, str] = {"c10d": "c10d", "static": "static", "etcd": "etcd", "etcd-v2": "etcd"}


def load_backend(name: str) -> Backend:
    """The backend called ``name`` (a key of ``BACKENDS``); may raise ``ImportError``."""
    backend: Backend = import_module(f"phalanx.rendezvous.backends.{BACKENDS[name]}").BACKEND
    return backend


def conf_keys(name: str) -> frozenset[str]:
    """The --rdzv-conf keys of backend ``name`` beside the settings' (none if it cannot load:
    ``spec_problems`` says why on many nodes)."""
    try:
        return load_backend(name).keys
    except ImportError:
        return frozenset()


def backend_problem(name: str) -> str | None:
    """The problem with ``--rdzv-backend name``, or None for a known backend."""
    if name in BACKENDS:
        return None
    return f"--rdzv-backend: unknown backend {name!r}; known: {', '.join(sorted(BACKENDS))}"


def spec_problems(spec: RendezvousSpec) -> tuple[RendezvousSettings, list[str]]:
    """Every usage problem with ``spec`` (nothing is contacted), and the parsed settings."""
    settings, _, problems = _checked(spec)
    return settings, problems


def _checked(spec: RendezvousSpec) -> tuple[RendezvousSettings, Any, list[str]]:
    """The settings, the backend's own options (what its ``open`` gets) and every problem."""
    if (unknown := backend_problem(spec.backend)) is not None:
        return RendezvousSettings(), None, [unknown]
    others = frozenset(spec.conf) - SETTINGS_KEYS  # the backend's to judge
    settings, problems = settings_problems(spec.conf, spec.backend, others)
    if (problem := check_run_id(spec.run_id)) is not None:
        problems.append(problem)
    if not 1 <= spec.min_nodes <= spec.max_nodes:
        problems.append(f"--nnodes {spec.min_nodes}:{spec.max_nodes}: expected 1 <= MIN <= MAX")
    try:
        backend = load_backend(spec.backend)
    except ImportError as exc:
        return settings, None, [*problems, f"--rdzv-backend {spec.backend} is not available: {exc}"]
    options, own = backend.check(spec)
    if not own and (fencing := timing_problem(backend.fencing(settings, options))) is not None:
        own = [fencing]
    return settings, options, [*problems, *own]


def create_handler(spec: RendezvousSpec) -> RendezvousHandler:
    """Validate ``spec`` (``UsageError`` listing every problem), then connect to or host the
    store (``RendezvousError`` if it cannot be reached within ``join_timeout``)."""
    settings, options, problems = _checked(spec)
    if problems:
        raise UsageError(problems)
    backend = load_backend(spec.backend)
    try:
        return backend.open(spec, settings, options)
    except StoreUnavailable as exc:
        raise RendezvousError(f"--rdzv-backend {spec.backend}: {exc}") from None
