"""The rendezvous flags of the command line, read as torchrun 2.13 reads them.

- ``--rdzv-backend`` defaults to ``static``: node 0 hosts the store at
  ``--master-addr:--master-port`` (29500 unless given), or at ``--rdzv-endpoint`` when one is
  given (it must name a port then).
- One node, static, with neither ``--master-port`` nor ``--rdzv-endpoint``: torchrun meets on
  ``localhost:0`` (c10d on a free port) instead, and so does phalanx, so two jobs on one
  machine never fight over 29500.
- A flag the chosen backend does not read is said in one line at start (``notes``), as
  torchrun warns about ``--master-addr`` and ``--node-rank``.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from functools import partial
from typing import Any

from phalanx import parsing
from phalanx.cli.problems import Problems
from phalanx.rendezvous.settings import unused_keys

DEFAULT_MASTER_PORT = 29500  # torchrun's, when --master-port is not given
_STATIC_ONLY = ("node_rank", "master_addr", "master_port")


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def rendezvous_flags(
    ns: argparse.Namespace, p: Problems, max_nodes: int, given: Mapping[str, str]
) -> tuple[dict[str, Any], list[str]]:
    """The rendezvous fields of the config (their own checks: ``launch.rendezvous_problems``)
    and the lines that say which given flags are not used (``given``: the flags the user set,
    ``cli.scheduler.given_flags``)."""
    node_rank = p.parse(lambda: parsing.parse_int(ns.node_rank, "--node-rank", minimum=0), 0)
    master_port = _master_port(ns.master_port, p)
    backend = str(ns.rdzv_backend).strip()
    endpoint = str(ns.rdzv_endpoint)
    master_addr = p.parse(lambda: parsing.check_host(ns.master_addr, "--master-addr"), "")
    # etcd takes a list of endpoints and http(s):// URLs, which its backend checks; c10d a
    # list of candidates for its store (the first serves it first: ``backends.successor``).
    if endpoint and backend not in ("etcd", "etcd-v2"):
        items = endpoint.split(",") if backend == "c10d" else [endpoint]
        parsed, *_ = [p.parse(partial(parsing.parse_endpoint, item), None) for item in items]
        if parsed is not None and backend == "static" and not ns.standalone:
            # torchrun's static meets at the endpoint when one is given.
            if parsed.port is None:
                p.add(f"--rdzv-endpoint {endpoint}: static rendezvous needs HOST:PORT")
            else:
                master_addr, master_port = parsed.host, parsed.port
    if ns.standalone or ns.hosts is not None or ns.hostfile is not None:
        backend = "c10d"  # torchrun's --standalone: localhost:0; a host list's agents: theirs
    elif backend == "static" and max_nodes == 1 and not endpoint and ns.master_port is None:
        backend = "c10d"  # torchrun 2.13: one node meets on localhost:0, a free port
    # (More than one node: the static backend's own check says it.)
    if node_rank >= max_nodes == 1 and backend == "static" and not ns.standalone:
        p.add(f"--node-rank: expected 0..{max_nodes - 1} for --nnodes {ns.nnodes}, got {node_rank}")
    local_addr = None
    if ns.local_addr is not None:
        local_addr = p.parse(lambda: parsing.check_host(ns.local_addr, "--local-addr"), None)
    no_conf: dict[str, str] = {}
    conf = p.parse(lambda: parsing.parse_kv_list(ns.rdzv_conf, "--rdzv-conf"), no_conf)
    fields = {
        "rdzv_backend": backend,
        "rdzv_endpoint": endpoint,
        "rdzv_id": str(ns.rdzv_id),
        "rdzv_conf": tuple(sorted(conf.items())),
        "node_rank": node_rank,
        "master_addr": master_addr,
        "master_port": master_port,
        "local_addr": local_addr,
        "worker_port": _worker_port(ns, p, backend, max_nodes, master_port),
    }
    return fields, _notes(ns, backend, given, conf)


def _master_port(text: str | None, p: Problems) -> int:
    """``--master-port`` as given, or torchrun's default when it is not."""
    if text is None:
        return DEFAULT_MASTER_PORT
    port = p.parse(lambda: parsing.parse_int(text, "--master-port", minimum=0), DEFAULT_MASTER_PORT)
    if not 0 <= port <= 65535:
        p.add(f"--master-port: expected 0..65535, got {port}")
    return port


def _worker_port(
    ns: argparse.Namespace, p: Problems, backend: str, max_nodes: int, master_port: int
) -> int | None:
    """--worker-port (None: a free port each round). Under static on several nodes node 0
    hosts the agents' store at --master-port for the whole job: the workers need another."""
    if ns.worker_port is None:
        return None
    port: int | None = p.parse(
        lambda: parsing.parse_int(ns.worker_port, "--worker-port", minimum=1), None
    )
    if port is not None and port > 65535:
        p.add(f"--worker-port: expected 1..65535, got {port}")
    elif port == master_port and backend == "static" and max_nodes > 1 and not ns.standalone:
        p.add(
            f"--worker-port {port}: node 0's rendezvous store holds --master-port {port} "
            "while the job runs; give the workers another port"
        )
    return port


def _notes(
    ns: argparse.Namespace, backend: str, given: Mapping[str, str], conf: Mapping[str, str]
) -> list[str]:
    """One line per rendezvous flag given that ``backend`` (the one used) does not read."""
    said = [f for f in ("rdzv_backend", "rdzv_endpoint", "rdzv_id", *_STATIC_ONLY) if f in given]
    if ns.standalone:
        return [
            f"{_flag(dest)} is not used with --standalone (one node, a local rendezvous on a "
            "free port)"
            for dest in said
        ]
    lines = unused_keys(conf, backend)
    for dest in said:
        if dest in _STATIC_ONLY and backend != str(ns.rdzv_backend).strip():
            lines.append(
                f"{_flag(dest)} is not used: one node without --master-port or "
                "--rdzv-endpoint meets on a free port (as torchrun)"
            )
        elif dest in _STATIC_ONLY and backend != "static":
            lines.append(
                f"{_flag(dest)} is only used by the static rendezvous; ignored with "
                f"--rdzv-backend {backend}, which meets at --rdzv-endpoint"
            )
        elif dest in ("master_addr", "master_port") and ns.rdzv_endpoint:
            lines.append(
                f"{_flag(dest)} is not used: the static rendezvous meets at --rdzv-endpoint "
                f"{ns.rdzv_endpoint} when one is given (as torchrun)"
            )
    return lines
