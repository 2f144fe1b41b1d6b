"""``--rdzv-backend etcd`` (and torchrun's ``etcd-v2`` name): dynamic rendezvous on etcd v3.

The store is etcd itself (``phalanx.rendezvous.stores.etcd``), reached through its gRPC-JSON
gateway; a node's liveness is its lease. Any agent can be lost without losing the store.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from urllib.parse import urlsplit

from phalanx.errors import UsageError
from phalanx.rendezvous import lastword
from phalanx.rendezvous.addr import node_address
from phalanx.rendezvous.api import RendezvousHandler
from phalanx.rendezvous.dynamic.opening import for_spec
from phalanx.rendezvous.fencing import FenceTiming, lease_timing
from phalanx.rendezvous.settings import SETTINGS_KEYS, RendezvousSettings
from phalanx.rendezvous.spec import Backend, RendezvousSpec
from phalanx.rendezvous.stores.etcd import conf
from phalanx.rendezvous.stores.etcd.store import open_etcd_store

log = logging.getLogger("phalanx")


def _store_conf(spec: RendezvousSpec) -> dict[str, str]:
    return {k: v for k, v in spec.conf.items() if k not in SETTINGS_KEYS}


@dataclass(frozen=True)
class Options:
    store: conf.EtcdOptions
    endpoints: list[str]  # base URLs, in the order given


def check(spec: RendezvousSpec) -> tuple[Options | None, list[str]]:
    try:
        options = conf.etcd_options_from_conf(_store_conf(spec), rendezvous_keys=SETTINGS_KEYS)
        endpoints = conf.parse_endpoints(spec.endpoint or "localhost", scheme=options.scheme)
    except UsageError as exc:
        return None, exc.problems
    return Options(options, endpoints), []


def open_handler(
    spec: RendezvousSpec, settings: RendezvousSettings, options: Options
) -> RendezvousHandler:
    for note in conf.credential_warnings(options.store, options.endpoints):
        log.warning("%s", note)  # once per agent: the handler is opened once
    store = open_etcd_store(options.endpoints, spec.run_id, options.store)
    first = urlsplit(options.endpoints[0])
    addr = node_address(first.hostname or "localhost", first.port or 2379, spec.local_addr)
    where = f"etcd at {', '.join(options.endpoints)}"
    reach = lastword.etcd(options.endpoints, options.store, store.receipt)
    return for_spec(store, spec, settings, addr, where, reach)


def fencing(settings: RendezvousSettings, options: Options) -> FenceTiming:
    """A node proves it is alive by renewing its lease."""
    return lease_timing(options.store.lease_ttl)


BACKEND = Backend(
    "etcd",
    "etcd v3 (torchrun's etcd-v2 name accepted)",
    check,
    open_handler,
    fencing,
    keys=conf.CONF_KEYS,
)
