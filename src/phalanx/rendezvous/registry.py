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

from collections.abc import Mapping
from dataclasses import dataclass, replace
from importlib import import_module
from typing import TYPE_CHECKING, Any

from phalanx.errors import RendezvousError, UsageError
from phalanx.parsing import node_range_problem
from phalanx.rendezvous.api import RendezvousHandler
from phalanx.rendezvous.fencing import timing_problem
from phalanx.rendezvous.settings import SETTINGS_KEYS, RendezvousSettings, settings_problems
from phalanx.rendezvous.stores.base import StoreUnavailable

if TYPE_CHECKING:  # a one-node launch reads the table and the keys only: no spec made
    from phalanx.rendezvous.spec import Backend, RendezvousSpec

# name -> its module in phalanx.rendezvous.backends
BACKENDS: dict[str, str] = {"c10d": "c10d", "static": "static", "etcd": "etcd", "etcd-v2": "etcd"}


def load_backend(name: str) -> Backend:
    """The backend called ``name`` (a key of ``BACKENDS``); may raise ``ImportError``."""
    backend: Backend = import_module(f"phalanx.rendezvous.backends.{BACKENDS[name]}").BACKEND
    return backend


# name -> the module and name of its --rdzv-conf keys: a module light to import, so that a
# one-node job checks its keys without importing the backend (c10d's is its store and the
# dynamic rendezvous: 50 modules, 30 ms of a launch); each equals its backend's ``keys``.
KEYS: dict[str, tuple[str, str]] = {
    "c10d": ("phalanx.rendezvous.stores.agentstore.conf", "C10D_KEYS"),
    "static": ("phalanx.rendezvous.stores.agentstore.conf", "CONF_KEYS"),
    "etcd": ("phalanx.rendezvous.stores.etcd.conf", "CONF_KEYS"),
    "etcd-v2": ("phalanx.rendezvous.stores.etcd.conf", "CONF_KEYS"),
}


def conf_keys(name: str) -> frozenset[str]:
    """The --rdzv-conf keys of backend ``name`` beside the settings' (none if they cannot
    load: ``spec_problems`` says why on many nodes)."""
    module, attribute = KEYS[name]
    try:
        keys: frozenset[str] = getattr(import_module(module), attribute)
    except ImportError:
        return frozenset()
    return keys


def backend_problem(name: str) -> str | None:
    """The problem with ``--rdzv-backend name``, or None for a known backend."""
    if name in BACKENDS:
        return None
    return f"--rdzv-backend: unknown backend {name!r}; known: {', '.join(sorted(BACKENDS))}"


@dataclass(frozen=True)
class CheckedRendezvous:
    """A rendezvous spec checked once: the parsed settings and the backend's own options
    (its endpoint parsed, its token read) travel from the check to ``open_handler``, so
    nothing is parsed or read twice. ``problems`` empty: it can be opened."""

    spec: RendezvousSpec
    settings: RendezvousSettings
    options: Any  # the backend's Options (what its ``open`` gets); None when problems
    problems: list[str]


def check(spec: RendezvousSpec) -> CheckedRendezvous:
    """Every usage problem with ``spec`` (nothing is contacted), with what was parsed."""
    from phalanx.rendezvous.dynamic.keys import check_run_id  # a store's rendezvous only

    if (unknown := backend_problem(spec.backend)) is not None:
        return CheckedRendezvous(spec, RendezvousSettings(), None, [unknown])
    others = frozenset(spec.conf) - SETTINGS_KEYS  # the backend's to judge
    settings, problems = settings_problems(spec.conf, spec.backend, others)
    if (problem := check_run_id(spec.run_id)) is not None:
        problems.append(problem)
    if (problem := node_range_problem(spec.min_nodes, spec.max_nodes)) is not None:
        problems.append(problem)
    try:
        backend = load_backend(spec.backend)
    except ImportError as exc:
        problems.append(f"--rdzv-backend {spec.backend} is not available: {exc}")
        return CheckedRendezvous(spec, settings, None, problems)
    options, own = backend.check(spec)
    if not own and (fencing := timing_problem(backend.fencing(settings, options))) is not None:
        own = [fencing]
    return CheckedRendezvous(spec, settings, options, [*problems, *own])


def spec_problems(spec: RendezvousSpec) -> tuple[RendezvousSettings, list[str]]:
    """Every usage problem with ``spec`` (nothing is contacted), and the parsed settings."""
    checked = check(spec)
    return checked.settings, checked.problems


def open_handler(
    checked: CheckedRendezvous, fingerprint: Mapping[str, str] | None = None
) -> RendezvousHandler:
    """Connect to or host the store of a checked spec (``UsageError`` listing its problems if
    it has any; ``RendezvousError`` if the store cannot be reached within ``join_timeout``).
    ``fingerprint``: what this node announces of its code (hashed only now, when it joins)."""
    if checked.problems:
        raise UsageError(checked.problems)
    spec = checked.spec if fingerprint is None else replace(checked.spec, fingerprint=fingerprint)
    backend = load_backend(spec.backend)
    try:
        return backend.open(spec, checked.settings, checked.options)
    except StoreUnavailable as exc:
        raise RendezvousError(f"--rdzv-backend {spec.backend}: {exc}") from None


def create_handler(spec: RendezvousSpec) -> RendezvousHandler:
    """``open_handler(check(spec))``: validate ``spec`` (``UsageError`` listing every
    problem), then connect to or host the store."""
    return open_handler(check(spec))
