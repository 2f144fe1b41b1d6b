"""``--rdzv-backend static``: node ranks given (``--node-rank``), ``--nnodes N`` fixed.

Node 0's agent hosts the coordination store (the agent store, ``stores.agentstore``: the
job's token proved both ways on every connection) at ``--master-addr:--master-port``,
listening on that address only; the others connect (retrying until ``join_timeout``). The workers do not use that port: node 0 picks a
fresh free port for them every round. It is the dynamic handler with ``min = max = N`` and
fixed ranks, so a failure on any node reaches every node and restarts are job-wide --
torchrun's static backend restarts only the failed node.
"""

from __future__ import annotations

import logging
import os

from phalanx.rendezvous import lastword
from phalanx.rendezvous.addr import node_address
from phalanx.rendezvous.api import RendezvousHandler
from phalanx.rendezvous.backends.claim import check_store, seed
from phalanx.rendezvous.dynamic.handler import DynamicRendezvous
from phalanx.rendezvous.settings import SETTINGS_KEYS, RendezvousSettings
from phalanx.rendezvous.spec import Backend, RendezvousSpec, unknown_keys
from phalanx.rendezvous.stores.agentstore import AgentKVStore, Token
from phalanx.rendezvous.stores.agentstore.conf import CONF_KEYS as TOKEN_KEYS
from phalanx.rendezvous.stores.agentstore.conf import no_token_warning, token_from_conf
from phalanx.rendezvous.stores.base import StoreUnavailable

log = logging.getLogger("phalanx")


def check(spec: RendezvousSpec) -> tuple[Token | None, list[str]]:
    """The token is its only option: node rank and master address/port are fields of the spec."""
    problems = unknown_keys(spec, TOKEN_KEYS, SETTINGS_KEYS)
    if spec.min_nodes != spec.max_nodes:
        problems.append(
            f"--nnodes {spec.min_nodes}:{spec.max_nodes}: static rendezvous needs a fixed "
            "node count (use c10d or etcd for MIN:MAX)"
        )
    if spec.node_rank is None:
        problems.append("--node-rank: static rendezvous needs this node's rank")
    elif not 0 <= spec.node_rank < spec.max_nodes:
        problems.append(
            f"--node-rank {spec.node_rank}: expected 0..{spec.max_nodes - 1} for --nnodes {spec.max_nodes}"
        )
    if not 0 < spec.master_port < 65536:
        problems.append(f"--master-port {spec.master_port}: expected 1..65535")
    token = token_from_conf(spec.conf, os.environ, problems)
    return (None if problems else token), problems


def open_handler(
    spec: RendezvousSpec, settings: RendezvousSettings, token: Token
) -> RendezvousHandler:
    host, port = spec.master_addr, spec.master_port
    where = f"the static store at {host}:{port}"
    if (warning := no_token_warning(token, where)) is not None:
        log.warning("%s", warning)
    if spec.node_rank == 0:
        try:
            store = AgentKVStore.host(
                host, port, token=token, read_timeout=settings.read_timeout,
                seed=seed(spec.run_id),
            )  # fmt: skip
        except OSError as exc:
            raise StoreUnavailable(
                f"node 0 cannot host the rendezvous store on --master-addr {host} "
                f"--master-port {port}: {exc.strerror or exc}"
            ) from None
        addr = spec.local_addr or host  # the user named node 0's address
    else:
        store = AgentKVStore.connect(
            host,
            port,
            token=token,
            connect_timeout=settings.join_timeout,
            read_timeout=settings.read_timeout,
        )
        addr = node_address(host, port, spec.local_addr)
    check_store(store, spec.run_id, where)
    reach = lastword.agent_store(host, port, token)  # (node 0 hosts: it has no last word)
    return DynamicRendezvous.for_spec(store, spec, settings, addr, where, reach)


BACKEND = Backend(
    "static", "node ranks given; node 0 hosts the store", check, open_handler, keys=TOKEN_KEYS
)
