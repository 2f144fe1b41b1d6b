"""Script arguments that differ between nodes: they run, as under torchrun, and are named.

An output name or a shard per node (``train.py --tag nodeA`` on one node, ``--tag nodeB`` on
the other) is a job torchrun runs without a word, and so does phalanx; what differs is said
once in one line, and in the event log (``script_args_differ``), so that two launches that
met by accident (the same endpoint and ``--rdzv-id``, other arguments) can be told from a
job meant that way. The script, the files its arguments name and the versions are still
compared (``compare``): those stop the job unless ``--allow-mismatch``.

The line names the arguments that differ: where every node has as many arguments, each
position that differs, with the flag before it when the nodes share that flag
(``--tag: nodeA (node 0), nodeB (node 1)``); otherwise each node's arguments.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from phalanx.consistency.compare import NodePlace
from phalanx.consistency.fingerprint import ARGS, PER_NODE, node_args

MAX_SHOWN = 8  # values named in the line; the event has every node's


@dataclass(frozen=True)
class ArgsDifference:
    """What differs, as a line and as the event's ``nodes`` (each node's rank, host and
    arguments; a string where it published only their hash)."""

    line: str
    what: str  # the line without its round: the same difference in another round
    nodes: list[dict[str, Any]]


def args_difference(
    nodes: Sequence[NodePlace], prints: Sequence[Mapping[str, str]], round_: int
) -> ArgsDifference | None:
    """None when every node that published its arguments gave the same ones (or only
    ``phalanx.spawn``'s ``per-node``); ``prints[i]`` is ``nodes[i]``'s fingerprint, and a
    rendezvous that carries none (one node) has nothing to compare."""
    if not prints:
        return None
    published = zip(nodes, prints, strict=True)
    pairs = sorted(
        ((node, fp) for node, fp in published if fp.get(ARGS, PER_NODE) != PER_NODE),
        key=lambda pair: pair[0].node_rank,
    )
    if len({fp[ARGS] for _, fp in pairs}) < 2:
        return None
    ranks = [node.node_rank for node, _ in pairs]
    lists = [node_args(fp) for _, fp in pairs]
    # Each node's arguments as the event and the line show them: the hash where no list.
    shown: list[list[str] | str] = [
        fp[ARGS] if args is None else args for (_, fp), args in zip(pairs, lists, strict=True)
    ]
    known = [args for args in lists if args is not None]
    if len(known) == len(lists) and len({len(args) for args in known}) == 1:
        what = _by_position(known, ranks)
    else:
        what = _grouped([f"[{a if isinstance(a, str) else shlex.join(a)}]" for a in shown], ranks)
    line = (
        f"round {round_}: script arguments differ between the nodes; each runs with its own, "
        f"as under torchrun: {what}"
    )
    events = [
        {"node": node.node_rank, "host": node.hostname, "args": args}
        for (node, _), args in zip(pairs, shown, strict=True)
    ]
    return ArgsDifference(line, what, events)


def _by_position(lists: list[list[str]], ranks: list[int]) -> str:
    """``FLAG: value (node r), ...`` for each position where the lists differ."""
    parts = []
    for i in range(len(lists[0])):
        values = [args[i] for args in lists]
        if len(set(values)) < 2:
            continue
        before = {args[i - 1] for args in lists} if i else set()
        flag = before.pop() if len(before) == 1 else ""
        label = flag if flag.startswith("-") else f"argument {i + 1}"
        parts.append(f"{label}: {_grouped([shlex.quote(v) for v in values], ranks)}")
    return "; ".join(parts)


def _grouped(values: list[str], ranks: list[int]) -> str:
    """``value (node 0, 2), other (node 1)``, in order of first node; past ``MAX_SHOWN``
    values, how many more."""
    groups: dict[str, list[int]] = {}
    for value, rank in zip(values, ranks, strict=True):
        groups.setdefault(value, []).append(rank)
    shown = [
        f"{value} (node {_ranks(members)})" for value, members in list(groups.items())[:MAX_SHOWN]
    ]
    if len(groups) > MAX_SHOWN:
        shown.append(f"... and {len(groups) - MAX_SHOWN} more values")
    return ", ".join(shown)


def _ranks(members: list[int]) -> str:
    named = ", ".join(map(str, members[:MAX_SHOWN]))
    return named if len(members) <= MAX_SHOWN else f"{named} and {len(members) - MAX_SHOWN} more"
