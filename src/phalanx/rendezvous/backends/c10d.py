"""``--rdzv-backend c10d``: dynamic rendezvous on the agent store that one of the agents hosts.

The store is phalanx's own (``stores.agentstore``), not torch's ``TCPStore``, so the agent
never imports torch; every connection proves the job's token (``PHALANX_RDZV_TOKEN`` or
``--rdzv-conf token_file=PATH``) both ways before anything else is read. It listens only on
the address the endpoint names (``0.0.0.0``: every interface).

Who hosts: ``--rdzv-conf is_host=true|false`` if given; otherwise an agent whose machine
the endpoint names (torchrun's heuristic) tries to, and connects as a client if another
process already serves that port. That client is no blind one: the holder of the port must
prove the token in the handshake, so a process that took the port without it (an intruder,
a stray ``TCPStore``, another job's store) is refused in one line, never obeyed. Everyone
else connects, retrying until ``join_timeout`` (the host may start later).

The store lives in the hosting agent: when that node is lost, the others see ``STORE_LOST``
from ``poll()`` within ``heartbeat_timeout`` (at once when the host's kernel resets the
connection) and stop their workers. In a round of 3 or more they then fail over: one of them
serves a new store and the job goes on (``successor``, ``dynamic.failover``); the candidates
are the endpoints of ``--rdzv-endpoint a:p,b:p,...`` in order (the job starts on the first),
or with one endpoint the members of the last round. A node started later with one endpoint
serves (or joins) a fresh store there, and follows the word the successor's host leaves in
it (``signpost``); where nothing answers there, it ends at ``join_timeout`` saying to give
every node's address.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

from phalanx.rendezvous import lastword
from phalanx.rendezvous.addr import is_this_machine, node_address
from phalanx.rendezvous.api import RendezvousHandler
from phalanx.rendezvous.backends.claim import check_store, seed
from phalanx.rendezvous.backends.successor import AgentStoreSuccessors
from phalanx.rendezvous.dynamic.opening import for_spec
from phalanx.rendezvous.settings import SETTINGS_KEYS, RendezvousSettings, parse_bool
from phalanx.rendezvous.spec import Backend, RendezvousSpec, split_endpoint, unknown_keys
from phalanx.rendezvous.stores.agentstore import AgentKVStore, Token
from phalanx.rendezvous.stores.agentstore.conf import C10D_KEYS as CONF_KEYS
from phalanx.rendezvous.stores.agentstore.conf import no_token_warning, token_from_conf
from phalanx.rendezvous.stores.base import StoreUnavailable

log = logging.getLogger("phalanx")

DEFAULT_PORT = 29400  # torchrun's default for c10d


@dataclass(frozen=True)
class Options:
    host: str
    port: int
    is_host: bool | None  # --rdzv-conf is_host; None: torchrun's heuristic
    token: Token = field(default=Token(), repr=False)
    endpoints: tuple[tuple[str, int], ...] = ()  # every candidate listed (the first: host, port)


def check(spec: RendezvousSpec) -> tuple[Options | None, list[str]]:
    problems = unknown_keys(spec, CONF_KEYS, SETTINGS_KEYS)
    endpoints: list[tuple[str, int]] = []
    for text in spec.endpoint.split(",") if spec.endpoint.strip() else [""]:
        try:
            endpoints.append(split_endpoint(text, DEFAULT_PORT))
        except ValueError as exc:
            problems.append(str(exc))
    host, port = endpoints[0] if endpoints else ("", 0)
    is_host = (
        parse_bool("is_host", spec.conf["is_host"], problems) if "is_host" in spec.conf else None
    )
    store_type = spec.conf.get("store_type", "tcp").strip().lower()
    if store_type != "tcp":
        problems.append(
            f"--rdzv-conf store_type={store_type}: phalanx supports tcp (a FileStore cannot "
            "serve several machines; use --standalone for one)"
        )
    token = token_from_conf(spec.conf, os.environ, problems)
    options = Options(host, port, is_host, token, tuple(endpoints))
    return (None if problems else options), problems


def open_store(
    host: str,
    port: int,
    is_host: bool | None,
    settings: RendezvousSettings,
    token: Token,
    run_id: str,
) -> AgentKVStore:
    """Host the store here or connect to it (see the module docstring); a store hosted here
    names ``run_id`` as its run (``claim``)."""
    if is_host if is_host is not None else is_this_machine(host):
        try:
            return AgentKVStore.host(
                host, port, token=token, read_timeout=settings.read_timeout, seed=seed(run_id)
            )
        except OSError as exc:
            if is_host:
                raise StoreUnavailable(
                    f"cannot host the rendezvous store on {host}:{port}: {exc.strerror or exc}"
                ) from None
            log.info(
                "rendezvous: port %d is served already; connecting as a client (the server "
                "must prove the job's token)", port,
            )  # fmt: skip
    return AgentKVStore.connect(
        host,
        port,
        token=token,
        connect_timeout=settings.join_timeout,
        read_timeout=settings.read_timeout,
    )


def open_handler(
    spec: RendezvousSpec, settings: RendezvousSettings, options: Options
) -> RendezvousHandler:
    where = f"the c10d store at {options.host}:{options.port}"
    if (warning := no_token_warning(options.token, where)) is not None:
        log.warning("%s", warning)
    endpoints = options.endpoints or ((options.host, options.port),)
    successors = AgentStoreSuccessors(endpoints, options.token, spec.run_id, settings)
    try:
        store = successors.newest(settings.join_timeout) or open_store(
            options.host, options.port, options.is_host, settings, options.token, spec.run_id
        )
    except StoreUnavailable as exc:
        unresolved = str(exc).startswith("cannot resolve")  # (``reach.wait_reachable``'s)
        if len(endpoints) > 1 or type(exc) is not StoreUnavailable or unresolved:
            raise  # (a name that does not resolve, or a peer that answered: no lost store)
        # After a failover the job's store is on a member's address, which a node given
        # only the lost host's cannot know: say what to change.
        raise StoreUnavailable(
            f"{exc}; if the job's store moved to another node after this host was lost, this "
            "node cannot find it from one endpoint: give every node's address in "
            "--rdzv-endpoint (host:port,host:port,..., the job's first store first)"
        ) from None
    check_store(store, spec.run_id, where)
    try:
        successors.attach(store)
    except BaseException:
        store.close()
        raise
    addr = node_address(options.host, options.port, spec.local_addr)
    at = successors.current
    reach = lastword.agent_store(at.host, at.port, options.token)
    return for_spec(store, spec, settings, addr, where, reach, successors)


BACKEND = Backend(
    "c10d", "the agent store, hosted by one agent", check, open_handler, keys=CONF_KEYS
)
