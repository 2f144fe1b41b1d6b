"""A run's events from every node its run directory knows of.

``<run dir>/events.jsonl`` is this node's; ``<run dir>/nodes/<node rank>/events.jsonl`` are
the other nodes', as they answered the last ``phalanx status`` asked here (through the
store: ``phalanx.status.exchange``; each copy capped, so a long run's oldest progress
samples may be missing from it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from phalanx.events.log import EVENTS_FILE, read_events

NODES_DIR = "nodes"  # the other nodes' copies, one directory per node rank


def read_run_events(run_dir: Path) -> list[dict[str, Any]]:
    """This node's events in file order, then each other node's (by the node rank its
    directory is named after), each record carrying its own ``node`` and ``host``. A record
    found twice (a node whose rank changed between two requests has two directories) is
    kept once. A node never asked, or whose file is missing, simply adds nothing."""
    sources = [run_dir / EVENTS_FILE]
    nodes = run_dir / NODES_DIR
    if nodes.is_dir():
        ranks = sorted(int(p.name) for p in nodes.iterdir() if p.name.isdigit())
        sources += [nodes / str(rank) / EVENTS_FILE for rank in ranks]
    seen: set[tuple[object, object, object]] = set()
    found = []
    for path in sources:
        try:
            records = read_events(path)
        except OSError:
            continue
        for record in records:
            key = (record.get("host"), record.get("mono"), record.get("seq"))
            if key not in seen:
                seen.add(key)
                found.append(record)
    return found
