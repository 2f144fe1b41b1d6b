"""``--rdzv-backend c10d``: dynamic rendezvous on a TCPStore that one of the agents hosts.

Who hosts: ``--rdzv-conf is_host=true|false`` if given; otherwise an agent whose machine
the endpoint names (torchrun's heuristic) tries to, and connects as a client if another
process already serves that port. Everyone else connects, retrying until ``join_timeout``
(the host may start later).

The store lives in the hosting agent: when that node is lost, the others see ``STORE_LOST``
from ``poll()`` within ``heartbeat_timeout`` (at once when the host's kernel resets the
connection), stop their workers, and ``next_round`` raises ``RendezvousError``. Nobody waits
longer than that; use ``etcd`` for a store that survives losing any node.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from phalanx.rendezvous.addr import is_this_machine, node_address
from phalanx.rendezvous.api import RendezvousHandler
from phalanx.rendezvous.dynamic.handler import DynamicRendezvous
from phalanx.rendezvous.settings import SETTINGS_KEYS, RendezvousSettings, parse_bool
from phalanx.rendezvous.spec import Backend, RendezvousSpec, split_endpoint, unknown_keys
from phalanx.rendezvous.stores.base import StoreUnavailable
from phalanx.rendezvous.stores.tcp import TcpKVStore

log = logging.getLogger("phalanx")

DEFAULT_PORT = 29400  # torchrun's default for c10d
CONF_KEYS = frozenset({"is_host", "store_type"})


@dataclass(frozen=True)
class Options:
    host: str
    port: int
    is_host: bool | None  # --rdzv-conf is_host; None: torchrun's heuristic


def check(spec: RendezvousSpec) -> tuple[Options | None, list[str]]:
    problems = unknown_keys(spec, CONF_KEYS, SETTINGS_KEYS)
    host, port = "", 0
    try:
        host, port = split_endpoint(spec.endpoint, DEFAULT_PORT)
    except ValueError as exc:
        problems.append(str(exc))
    is_host = (
        parse_bool("is_host", spec.conf["is_host"], problems) if "is_host" in spec.conf else None
    )
    store_type = spec.conf.get("store_type", "tcp").strip().lower()
    if store_type != "tcp":
        problems.append(
            f"--rdzv-conf store_type={store_type}: phalanx supports tcp (a FileStore cannot "
            "serve several machines; use --standalone for one)"
        )
    return (None if problems else Options(host, port, is_host)), problems


def open_store(
    host: str, port: int, is_host: bool | None, settings: RendezvousSettings
) -> TcpKVStore:
    """Host the store here or connect to it (see the module docstring)."""
    if is_host if is_host is not None else is_this_machine(host):
        try:
            return TcpKVStore.host(host, port, read_timeout=settings.read_timeout)
        except (RuntimeError, OSError) as exc:
            if is_host:
                raise StoreUnavailable(
                    f"cannot host the rendezvous store on port {port}: {exc}"
                ) from None
            log.info("rendezvous: port %d is served already; connecting as a client", port)
    return TcpKVStore.connect(
        host, port, connect_timeout=settings.join_timeout, read_timeout=settings.read_timeout
    )


def open_handler(
    spec: RendezvousSpec, settings: RendezvousSettings, options: Options
) -> RendezvousHandler:
    store = open_store(options.host, options.port, options.is_host, settings)
    addr = node_address(options.host, options.port, spec.local_addr)
    return DynamicRendezvous.for_spec(store, spec, settings, addr)


BACKEND = Backend("c10d", "TCPStore hosted by one agent", check, open_handler)
