"""``--rdzv-backend static``: node ranks given (``--node-rank``), ``--nnodes N`` fixed.

Node 0's agent hosts the coordination store (the agent store, ``stores.agentstore``: the job's
token proved both ways on every connection) at ``--master-addr:--master-port``, listening on
that address only; the others connect (retrying until ``join_timeout``). The workers cannot use
that port, which the agents' store keeps while the job runs (torchrun's workers share its
agent's ``TCPStore`` there; phalanx's agent never imports torch): node 0 picks a free port for
them every round, or ``--worker-port`` one for every round. A node that takes node rank 0 while
another node is node 0 (the default ``--node-rank``) cannot listen here: a usage error saying
what to change. It is the dynamic handler with ``min = max = N`` and fixed ranks, so a failure
on any node reaches every node and restarts are job-wide -- torchrun's static backend restarts
only the failed node.
"""

from __future__ import annotations

import errno
import logging
import os

from phalanx.errors import UsageError
from phalanx.rendezvous import lastword
from phalanx.rendezvous.addr import node_address
from phalanx.rendezvous.api import RendezvousHandler
from phalanx.rendezvous.backends.claim import check_store, seed
from phalanx.rendezvous.dynamic.opening import for_spec
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
            problem = _wrong_node_0(spec, exc)
            if problem is not None:
                raise UsageError(problem) from None
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
    return for_spec(store, spec, settings, addr, where, reach)


def _wrong_node_0(spec: RendezvousSpec, exc: OSError) -> str | None:
    """What to change when node 0 could not listen at ``--master-addr:--master-port`` for a
    reason a command line explains (None for others: the store's error, exit 1).

    A port in use or an address of another machine is almost always a node that took the
    default ``--node-rank 0`` (torchrun's too) while another node is node 0: a usage error
    (exit 2) found at run time, said in one line with what to change."""
    where = (
        f"node 0 cannot host the rendezvous store on --master-addr {spec.master_addr} "
        f"--master-port {spec.master_port}"
    )
    ranks = (
        f"give each node its own --node-rank (0 to {spec.max_nodes - 1}; it defaults to 0), "
        "or use --rdzv-backend c10d --rdzv-endpoint HOST:PORT, which gives the ranks itself"
    )
    if exc.errno == errno.EADDRINUSE:
        return (
            f"{where}: the port is in use (another node of this job started as node 0 on "
            f"this machine?): {ranks}; if no node of this job holds the port, free it or "
            "pick another --master-port"
        )
    if exc.errno == errno.EADDRNOTAVAIL:
        return (
            f"{where}: {spec.master_addr} is not an address of this machine, so this node "
            f"is not node 0, which hosts the store there: {ranks}"
        )
    return None


BACKEND = Backend(
    "static", "node ranks given; node 0 hosts the store", check, open_handler, keys=TOKEN_KEYS
)
