"""The node check's verdict: every node's figures, the round's medians, the nodes named.

Pure: every node computes it from the same records (``round``), so every node names the same
nodes. A node's network figures are those of its best link (the one it tested, to the next
node of the ring, and the one the node before it tested, to it): a slow or lossy node spoils
both of its links, a neighbour of it only one. With two nodes both share one link, so a
network fault cannot be put on either (nobody is named for it); compute and local problems
are named from two nodes up.

A link that could not connect is no figure but a refusal, and names the end that refused it
(``link.PEER``: the node it was to; ``link.SELF``: the node it was from) whatever its other
link did, from two nodes up: the workers connect to each other as the check does, so their
process group would hang or fail to start.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from phalanx.nodecheck.link import LINK_DEADLINE, PEER, SELF
from phalanx.nodecheck.settings import Thresholds


@dataclass(frozen=True)
class Named:
    node_rank: int
    host: str
    addr: str
    line: str  # one line: what is wrong, its figure and the median

    def to_json(self) -> dict[str, object]:
        return {"node": self.node_rank, "host": self.host, "addr": self.addr, "line": self.line}


@dataclass(frozen=True)
class Row:
    node_rank: int
    host: str
    addr: str
    device: str = "-"
    compute: float | None = None  # multiply-adds per second
    latency_ms: float | None = None  # the best link's; None: no link answered
    throughput: float | None = None  # MB/s, the best link's
    answered: bool = True


@dataclass(frozen=True)
class Verdict:
    rows: tuple[Row, ...]
    medians: dict[str, float | None]
    named: tuple[Named, ...] = field(default=())

    def named_ranks(self) -> set[int]:
        return {n.node_rank for n in self.named}

    def to_json(self) -> dict[str, Any]:
        return {
            "nodes": [row.__dict__ for row in self.rows],
            "medians": self.medians,
            "named": [n.to_json() for n in self.named],
        }


def judge(
    hosts: Sequence[tuple[str, str]], records: Mapping[int, Mapping[str, Any]], limits: Thresholds
) -> Verdict:
    """The verdict on the round's nodes (``hosts``: host name and address, by node rank)
    from their ``records`` (``round.check_round``; a node without one did not answer)."""
    n = len(hosts)
    links: dict[int, list[Mapping[str, Any]]] = {rank: [] for rank in range(n)}
    for rank, record in records.items():
        link = record.get("link")
        if isinstance(link, Mapping) and n > 1:
            links[rank].append(link)
            links[(rank + 1) % n].append(link)
    rows = [_row(rank, *hosts[rank], records.get(rank), links[rank]) for rank in range(n)]
    medians = {
        "compute": _median([r.compute for r in rows]),
        "latency_ms": _median([r.latency_ms for r in rows if r.answered]),
        "throughput": _median([r.throughput for r in rows]),
    }
    refusals = _refusals(rows, records)
    named: list[Named] = []
    for row in rows:
        record = records.get(row.node_rank) or {}
        lines = _lines(row, record, medians, limits, n) + refusals.get(row.node_rank, [])
        named += [Named(row.node_rank, row.host, row.addr, line) for line in lines]
    return Verdict(tuple(rows), medians, tuple(named))


def _refusals(
    rows: Sequence[Row], records: Mapping[int, Mapping[str, Any]]
) -> dict[int, list[str]]:
    """The lines of the links that could not connect, by the node that refused each (one
    that did not answer the check is named for that already)."""
    found: dict[int, list[str]] = {}
    n = len(rows)
    for rank, record in sorted(records.items()):
        link = record.get("link")
        if n < 2 or not isinstance(link, Mapping) or link.get("refused_by") not in (PEER, SELF):
            continue
        source, target = rows[rank], rows[(rank + 1) % n]
        why = str(link.get("error") or "no answer")
        if link["refused_by"] == PEER and target.answered:
            found.setdefault(target.node_rank, []).append(
                f"node check: {_who(target)} refused the link from {_who(source)}: no "
                f"connection within {LINK_DEADLINE:g} s ({why}); its workers would not be "
                "reached either (a firewall that drops connections to it?)"
            )
        elif link["refused_by"] == SELF:
            found.setdefault(source.node_rank, []).append(
                f"node check: {_who(source)} could not open the link to {_who(target)} "
                f"({why}); its workers could not reach the others either (its routes, or a "
                "local policy?)"
            )
    return found


def _who(row: Row) -> str:
    return f"node {row.node_rank} ({row.host}, {row.addr})"


def _row(
    rank: int,
    host: str,
    addr: str,
    record: Mapping[str, Any] | None,
    links: list[Mapping[str, Any]],
) -> Row:
    if record is None:
        return Row(rank, host, addr, answered=False)
    latencies = [float(x["latency_ms"]) for x in links if _number(x.get("latency_ms"))]
    rates = [float(x["throughput"]) for x in links if _number(x.get("throughput"))]
    compute = record.get("compute")
    return Row(
        rank,
        host,
        addr,
        str(record.get("device", "-")),
        float(compute) if isinstance(compute, (int, float)) else None,
        min(latencies) if latencies else None,
        max(rates) if rates else None,
    )


def _lines(
    row: Row,
    record: Mapping[str, Any],
    medians: Mapping[str, float | None],
    limits: Thresholds,
    n: int,
) -> list[str]:
    who = _who(row)
    if not row.answered:
        return [f"node check: {who} did not answer the node check in time"]
    lines = [f"node check: {who}: {problem}" for problem in record.get("problems") or ()]
    compute, rate, latency = medians["compute"], medians["throughput"], medians["latency_ms"]
    if row.compute is not None and compute and row.compute < compute / limits.compute:
        lines.append(
            f"node check: {who} computes slowly: {_mops(row.compute)}, median {_mops(compute)} "
            f"(named under 1/{limits.compute:g} of the median)"
        )
    if n < 3:
        return lines  # one link between two nodes: a network fault is nobody's in particular
    if row.throughput is not None and rate and row.throughput < rate / limits.throughput:
        lines.append(
            f"node check: {who} has a slow network: {row.throughput:.1f} MB/s, median "
            f"{rate:.1f} MB/s (named under 1/{limits.throughput:g} of the median)"
        )
    if latency is not None and (
        row.latency_ms is None
        or (
            row.latency_ms > latency * limits.latency
            and row.latency_ms - latency > limits.latency_ms
        )
    ):
        figure = "no round trip in time" if row.latency_ms is None else f"{row.latency_ms:.1f} ms"
        lines.append(
            f"node check: {who} has a slow or lossy network: latency {figure}, median "
            f"{latency:.1f} ms (named over {limits.latency:g}x the median and "
            f"{limits.latency_ms:g} ms above it)"
        )
    return lines


def table(verdict: Verdict) -> list[str]:
    """The verdict as a table (``phalanx check``), a line per node, then the medians."""
    rows = [["NODE", "HOST", "ADDRESS", "DEVICE", "COMPUTE", "LATENCY", "THROUGHPUT", "VERDICT"]]
    named = verdict.named_ranks()
    for row in verdict.rows:
        rows.append([
            str(row.node_rank), row.host, row.addr, row.device,
            _mops(row.compute) if row.compute is not None else "-",
            f"{row.latency_ms:.2f} ms" if row.latency_ms is not None else "-",
            f"{row.throughput:.1f} MB/s" if row.throughput is not None else "-",
            "no answer" if not row.answered else ("NAMED" if row.node_rank in named else "ok"),
        ])  # fmt: skip
    m = verdict.medians
    rows.append([
        "median", "", "", "",
        _mops(m["compute"]) if m["compute"] is not None else "-",
        f"{m['latency_ms']:.2f} ms" if m["latency_ms"] is not None else "-",
        f"{m['throughput']:.1f} MB/s" if m["throughput"] is not None else "-",
        "",
    ])  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows
    ]
    return lines + [n.line for n in verdict.named]


def _mops(rate: float) -> str:
    return f"{rate / 1e6:.2f} Mop/s" if rate < 1e11 else f"{rate / 1e12:.1f} Top/s"


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None
