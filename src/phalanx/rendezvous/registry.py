"""The rendezvous backends by name, and the one entry point the launcher calls.

============  ================================================================================
``c10d``      dynamic (MIN:MAX) on a TCPStore hosted by one agent (``c10d``)
``static``    fixed node ranks; node 0 hosts the store at --master-addr:--master-port
``etcd``      dynamic on etcd v3 (``etcd``); ``etcd-v2`` is torchrun's name, same backend
============  ================================================================================

The etcd entry is loaded on first use from ``phalanx.rendezvous.etcd`` (its
``create_etcd_store(endpoint, run_id, conf)``) and ``etcd_conf`` (its option check), so the
launcher never imports it otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

from phalanx.errors import RendezvousError, UsageError
from phalanx.rendezvous.addr import node_address
from phalanx.rendezvous.api import RendezvousHandler
from phalanx.rendezvous.dynamic import DynamicRendezvous
from phalanx.rendezvous.keys import check_run_id
from phalanx.rendezvous.settings import SETTINGS_KEYS, RendezvousSettings, settings_problems
from phalanx.rendezvous.spec import Backend, RendezvousSpec
from phalanx.rendezvous.store import StoreUnavailable


def _c10d() -> Backend:
    from phalanx.rendezvous import c10d

    return c10d.BACKEND


def _static() -> Backend:
    from phalanx.rendezvous import static

    return static.BACKEND


def _etcd() -> Backend:
    from phalanx.rendezvous import etcd, etcd_conf

    def store_conf(spec: RendezvousSpec) -> dict[str, str]:
        return {k: v for k, v in spec.conf.items() if k not in SETTINGS_KEYS}

    def check(spec: RendezvousSpec) -> list[str]:
        try:
            options = etcd_conf.etcd_options_from_conf(
                store_conf(spec), rendezvous_keys=SETTINGS_KEYS
            )
            etcd_conf.parse_endpoints(spec.endpoint or "localhost", scheme=options.scheme)
        except UsageError as exc:
            return exc.problems
        return []

    def open_handler(spec: RendezvousSpec, settings: RendezvousSettings) -> RendezvousHandler:
        endpoint = spec.endpoint or "localhost"
        store = etcd.create_etcd_store(endpoint, spec.run_id, store_conf(spec))
        first = urlsplit(etcd_conf.parse_endpoints(endpoint)[0])
        addr = node_address(first.hostname or "localhost", first.port or 2379, spec.local_addr)
        return DynamicRendezvous(
            store,
            run_id=spec.run_id,
            min_nodes=spec.min_nodes,
            max_nodes=spec.max_nodes,
            addr=addr,
            settings=settings,
            worker_port=spec.worker_port,
        )

    return Backend("etcd", "etcd v3 (torchrun's etcd-v2 name accepted)", check, open_handler)


BACKENDS: dict[str, Callable[[], Backend]] = {
    "c10d": _c10d,
    "static": _static,
    "etcd": _etcd,
    "etcd-v2": _etcd,
}


def spec_problems(spec: RendezvousSpec) -> tuple[RendezvousSettings, list[str]]:
    """Every usage problem with ``spec`` (nothing is contacted), and the parsed settings."""
    loader = BACKENDS.get(spec.backend)
    if loader is None:
        known = ", ".join(BACKENDS)
        return RendezvousSettings(), [
            f"--rdzv-backend: unknown backend {spec.backend!r}; known: {known}"
        ]
    others = frozenset(spec.conf) - SETTINGS_KEYS  # the backend's to judge
    settings, problems = settings_problems(spec.conf, spec.backend, others)
    if (problem := check_run_id(spec.run_id)) is not None:
        problems.append(problem)
    if not 1 <= spec.min_nodes <= spec.max_nodes:
        problems.append(f"--nnodes {spec.min_nodes}:{spec.max_nodes}: expected 1 <= MIN <= MAX")
    try:
        backend = loader()
    except ImportError as exc:
        return settings, [*problems, f"--rdzv-backend {spec.backend} is not available: {exc}"]
    return settings, [*problems, *backend.check(spec)]


def create_handler(spec: RendezvousSpec) -> RendezvousHandler:
    """Validate ``spec`` (``UsageError`` listing every problem), then connect to or host the
    store (``RendezvousError`` if it cannot be reached within ``join_timeout``)."""
    settings, problems = spec_problems(spec)
    if problems:
        raise UsageError(problems)
    backend = BACKENDS[spec.backend]()
    try:
        return backend.open(spec, settings)
    except StoreUnavailable as exc:
        raise RendezvousError(f"--rdzv-backend {spec.backend}: {exc}") from None
