"""How the nodes meet: the rendezvous's flags and this node's place among them."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_RDZV_ID = "none"  # torchrun's default --rdzv-id


def shown_run_id(run_id: str, quote: bool = True) -> str:
    """How messages name a run id (``quote``: in quotes), or, for the default one, that none
    was given: a user who gave no ``--rdzv-id`` never chose 'none'."""
    if run_id == DEFAULT_RDZV_ID:
        return "(no --rdzv-id given)"
    return repr(run_id) if quote else run_id


@dataclass(frozen=True)
class RendezvousConfig:
    min_nodes: int = 1
    max_nodes: int = 1
    standalone: bool = False
    rdzv_backend: str = "c10d"
    rdzv_endpoint: str = ""
    rdzv_id: str = DEFAULT_RDZV_ID
    rdzv_conf: tuple[tuple[str, str], ...] = ()
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    local_addr: str | None = None
    # The workers' MASTER_PORT in every round (phalanx.spawn: the port the program was given
    # and will use); None: a fresh free port per round.
    worker_port: int | None = None

    @property
    def is_multi_node(self) -> bool:
        return self.max_nodes > 1

    @property
    def rdzv_conf_dict(self) -> dict[str, str]:
        return dict(self.rdzv_conf)
