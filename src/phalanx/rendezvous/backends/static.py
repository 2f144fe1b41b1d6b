"""``--rdzv-backend static``: node ranks given (``--node-rank``), ``--nnodes N`` fixed.

Node 0's agent hosts the coordination store at ``--master-addr:--master-port``; the others
connect (retrying until ``join_timeout``). The workers do not use that port: node 0 picks a
fresh free port for them every round. It is the dynamic handler with ``min = max = N`` and
fixed ranks, so a failure on any node reaches every node and restarts are job-wide --
torchrun's static backend restarts only the failed node.
"""

from __future__ import annotations

from phalanx.rendezvous.addr import node_address
from phalanx.rendezvous.api import RendezvousHandler
from phalanx.rendezvous.dynamic.handler import DynamicRendezvous
from phalanx.rendezvous.settings import SETTINGS_KEYS, RendezvousSettings
from phalanx.rendezvous.spec import Backend, RendezvousSpec, unknown_keys
from phalanx.rendezvous.stores.base import StoreUnavailable
from phalanx.rendezvous.stores.tcp import TcpKVStore


def check(spec: RendezvousSpec) -> tuple[None, list[str]]:
    """No options of its own: node rank and master address/port are fields of the spec."""
    problems = unknown_keys(spec, frozenset(), SETTINGS_KEYS)
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
    return None, problems


def open_handler(
    spec: RendezvousSpec, settings: RendezvousSettings, options: None
) -> RendezvousHandler:
    host, port = spec.master_addr, spec.master_port
    if spec.node_rank == 0:
        try:
            store = TcpKVStore.host(host, port, read_timeout=settings.read_timeout)
        except (RuntimeError, OSError) as exc:
            raise StoreUnavailable(
                f"node 0 cannot host the rendezvous store on --master-port {port}: {exc}"
            ) from None
        addr = spec.local_addr or host  # the user named node 0's address
    else:
        store = TcpKVStore.connect(
            host, port, connect_timeout=settings.join_timeout, read_timeout=settings.read_timeout
        )
        addr = node_address(host, port, spec.local_addr)
    return DynamicRendezvous.for_spec(store, spec, settings, addr)


BACKEND = Backend("static", "node ranks given; node 0 hosts the store", check, open_handler)
