"""The check itself: a pure function of every member's fingerprint, the same on every node.

Version fields (``fingerprint.VERSION_FIELDS``) are compared among the nodes that could read
them (a CPU build has no CUDA version; that is not a difference). Content fields (the script,
the files named on the command line) are compared on every node: a file one node lacks is
``missing`` there -- if that node's arguments name it; a file only other nodes' arguments
name (an output name per node) is not compared with it. The arguments themselves are no
difference here: nodes may run with their own (``consistency.perargs`` names them).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Protocol

from phalanx.consistency.fingerprint import ARGS, MISSING, VERSION_FIELDS, names_path

MAX_ROWS = 16  # past this many nodes the table shows only those that differ
UNKNOWN = "unknown"


class NodePlace(Protocol):
    """Where a node is, as the table names it (the rendezvous's ``NodeInfo`` is one): the
    comparison sits below the rendezvous, which runs it on admission."""

    @property
    def node_rank(self) -> int: ...
    @property
    def hostname(self) -> str: ...
    @property
    def addr(self) -> str: ...


def differing_fields(prints: Sequence[Mapping[str, str]]) -> list[str]:
    """The fields whose values are not all equal: versions first, then the script, then the
    files in name order (never the arguments: see the module docstring)."""
    names = {name for fp in prints for name in fp} - {ARGS}
    ordered = [f for f in VERSION_FIELDS if f in names]
    ordered += sorted(names - set(VERSION_FIELDS), key=lambda f: (f != "script", f))
    return [f for f in ordered if len(set(_values(prints, f)) - {UNKNOWN}) > 1]


def mismatch_table(
    nodes: Sequence[NodePlace], prints: Sequence[Mapping[str, str]], hint: str
) -> str | None:
    """None when every node runs the same code; otherwise the message naming the nodes
    (rank, host, address) that differ and in what. ``prints[i]`` is ``nodes[i]``'s fingerprint; a
    node that published none (an older phalanx) is not compared."""
    if not prints:
        return None
    pairs = [(node, fp) for node, fp in zip(nodes, prints, strict=True) if fp]
    fields = differing_fields([fp for _, fp in pairs])
    if not fields:
        return None
    columns = {f: _values([fp for _, fp in pairs], f) for f in fields}
    common = {f: _most_common(values) for f, values in columns.items()}
    rows = []
    for i, (node, _) in enumerate(pairs):
        cells = []
        for f in fields:
            value = columns[f][i]
            odd = value not in (common[f], UNKNOWN)
            cells.append(("*" if odd else " ") + value)
        # The address too: hosts that share a name (containers, namespaces) still differ by it.
        place = [str(node.node_rank), node.hostname, node.addr]
        rows.append((any(c.startswith("*") for c in cells), [*place, *cells]))
    shown = [row for odd, row in rows if odd or len(rows) <= MAX_ROWS]
    header = ["node", "host", "addr", *(f" {f}" for f in fields)]
    widths = [max(len(r[c]) for r in [header, *shown]) for c in range(len(header))]
    lines = [
        f"the nodes do not run the same code and versions (they differ in: {', '.join(fields)}):",
        *("  " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
          for r in [header, *shown]),
    ]  # fmt: skip
    if len(shown) < len(rows):
        lines.append(f"  ... and {len(rows) - len(shown)} more node(s) with the common values")
    lines.append("  (* differs from most nodes; file paths are compared as written)")
    lines.append(hint)
    return "\n".join(lines)


def _values(prints: Sequence[Mapping[str, str]], field: str) -> list[str]:
    return [fp.get(field, _absent(fp, field)) for fp in prints]


def _absent(fp: Mapping[str, str], field: str) -> str:
    """What a node without ``field`` has there: not compared (a version it could not read, a
    file its arguments do not name), or ``missing`` (the script, a file it names)."""
    if field in VERSION_FIELDS:
        return UNKNOWN
    kind, _, path = field.partition(" ")
    return MISSING if kind != "file" or names_path(fp, path) else UNKNOWN


def _most_common(values: list[str]) -> str:
    """The most frequent known value; a tie goes to the one the lowest node rank has."""
    counts = Counter(v for v in values if v != UNKNOWN)
    best = max(counts.values())
    return next(v for v in values if counts.get(v) == best)
