"""The node check's pure parts: its thresholds as the flag gives them, and the verdict on a
round's records (which node is named, in what line), as tables."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from phalanx.cli.argv import expanded, parse_config
from phalanx.errors import UsageError
from phalanx.nodecheck import Thresholds, judge, table
from phalanx.nodecheck.link import PEER, SELF
from support.launch import PHALANX, worker

SCRIPT = worker("echo_args.py")

HOSTS = [(f"h{i}", f"10.0.0.{i + 1}") for i in range(4)]


def record(
    compute: float = 1e7, latency: float | None = 0.1, rate: float = 1000.0, **more: Any
) -> dict[str, Any]:
    link = {"latency_ms": latency, "throughput": rate, "error": "", "refused_by": ""}
    return {"host": "h", "device": "cpu", "compute": compute, "problems": [], "link": link, **more}


def refused(by: str, error: str = "no answer in time") -> dict[str, Any]:
    """The record of a node whose link could not connect: refused by ``by`` (link.PEER,
    link.SELF)."""
    link = {"latency_ms": None, "throughput": 0.0, "error": error, "refused_by": by}
    return {**record(), "link": link}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", Thresholds()),
        ("compute=5", Thresholds(compute=5)),
        ("throughput=2.5, latency_ms=50", Thresholds(throughput=2.5, latency_ms=50)),
        ("min_free_mb=1024,latency=4", Thresholds(min_free_mb=1024, latency=4)),
    ],
)
def test_thresholds_parse(text: str, expected: Thresholds) -> None:
    assert Thresholds.parse(text) == expected


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("speed=3", "expected key=value with a key of"),
        ("compute", "expected key=value"),
        ("compute=fast", "expected a positive number"),
        ("latency_ms=-1", "expected a positive number"),
        ("compute=1", "must be above 1"),
    ],
)
def test_thresholds_refused(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        Thresholds.parse(text)


def named(
    records: dict[int, dict[str, Any]], limits: Thresholds | None = None
) -> dict[int, list[str]]:
    found: dict[int, list[str]] = {}
    for n in judge(HOSTS, records, limits or Thresholds()).named:
        found.setdefault(n.node_rank, []).append(n.line)
    return found


def test_healthy_round_names_nobody() -> None:
    records = {i: record(compute=1e7 * (1 + i / 10), latency=0.1 + i / 100) for i in range(4)}
    assert named(records) == {}


def test_a_slow_node_is_named_with_its_figure_and_the_median() -> None:
    records = {i: record() for i in range(4)}
    records[2] = record(compute=2e6)
    (line,) = named(records)[2]
    assert line == (
        "node check: node 2 (h2, 10.0.0.3) computes slowly: 2.00 Mop/s, median 10.00 Mop/s "
        "(named under 1/3 of the median)"
    )
    assert named(records, Thresholds(compute=6)) == {}  # settable: 5x below is not 6x


def test_a_bad_link_is_put_on_the_node_both_its_links_touch() -> None:
    """Node 2's own link (2->3) and the one to it (1->2) are slow; 1 and 3 have one good link."""
    records = {i: record() for i in range(4)}
    records[1] = record(rate=1.0, latency=150.0)
    records[2] = record(rate=1.0, latency=None)
    lines = named(records)
    assert list(lines) == [2], lines
    assert "slow network: 1.0 MB/s, median" in lines[2][0]
    assert "latency 150.0 ms, median" in lines[2][1]


def test_two_nodes_share_one_link_so_a_link_fault_is_nobodys() -> None:
    records = {0: record(rate=1.0), 1: record()}
    assert judge(HOSTS[:2], records, Thresholds()).named == ()


def test_latency_under_the_floor_names_nobody() -> None:
    """10x the median but only 1 ms above it: noise, not a fault (latency_ms=20)."""
    records = {i: record(latency=0.1) for i in range(4)}
    records[1] = record(latency=1.1)
    records[2] = record(latency=1.1)
    assert named(records) == {}


def test_a_missing_record_and_a_local_problem_are_named() -> None:
    records = {i: record() for i in range(4)}
    del records[3]
    records[0] = record(problems=["the run directory /x is not writable: Read-only file system"])
    lines = named(records)
    assert lines[3] == ["node check: node 3 (h3, 10.0.0.4) did not answer the node check in time"]
    assert lines[0] == ["node check: node 0 (h0, 10.0.0.1): the run directory /x is not writable: Read-only file system"]  # fmt: skip
    shown = table(judge(HOSTS, records, Thresholds()))
    assert shown[0].split() == ["NODE", "HOST", "ADDRESS", "DEVICE", "COMPUTE", "LATENCY", "THROUGHPUT", "VERDICT"]  # fmt: skip
    assert shown[4].endswith("no answer") and shown[1].endswith("NAMED")


def test_a_node_without_a_round_trip_on_either_link_is_named() -> None:
    """Node 2's both links (1->2, 2->3) connected but finished no round trip: it is named,
    and its neighbours, each with one good link, are not."""
    records = {i: record() for i in range(4)}
    records[1] = record(latency=None)
    records[2] = record(latency=None)
    lines = named(records)
    assert list(lines) == [2], lines
    assert lines[2] == [
        "node check: node 2 (h2, 10.0.0.3) has a slow or lossy network: latency no round trip "
        "in time, median 0.1 ms (named over 10x the median and 20 ms above it)"
    ]


PEER_LINE = (
    "node check: node {to} (h{to}, 10.0.0.{to1}) refused the link from node {of} (h{of}, "
    "10.0.0.{of1}): no connection within 3 s (no answer in time); its workers would not be "
    "reached either (a firewall that drops connections to it?)"
)
SELF_LINE = (
    "node check: node {of} (h{of}, 10.0.0.{of1}) could not open the link to node {to} (h{to}, "
    "10.0.0.{to1}) ([Errno 1] Operation not permitted); its workers could not reach the "
    "others either (its routes, or a local policy?)"
)


def line(template: str, of: int, to: int) -> str:
    return template.format(of=of, to=to, of1=of + 1, to1=to + 1)


@pytest.mark.parametrize(
    ("nodes", "bad", "by", "expected"),
    [
        # two nodes: 0 -> 1 refused by 1 while 1 -> 0 worked (a one-way firewall on 1)
        (2, {0: PEER}, "", {1: [line(PEER_LINE, 0, 1)]}),
        (2, {1: PEER}, "", {0: [line(PEER_LINE, 1, 0)]}),
        # this node's own kernel would not send it: the node it came from is named
        (2, {0: SELF}, "[Errno 1] Operation not permitted", {0: [line(SELF_LINE, 0, 1)]}),
        # four nodes: 2 refuses 1's link; its own link to 3 worked, and its figures (the
        # better link's) are fine: named all the same
        (4, {1: PEER}, "", {2: [line(PEER_LINE, 1, 2)]}),
        (4, {3: SELF}, "[Errno 1] Operation not permitted", {3: [line(SELF_LINE, 3, 0)]}),
    ],
)
def test_a_link_that_could_not_connect_names_the_end_that_refused_it(
    nodes: int, bad: dict[int, str], by: str, expected: dict[int, list[str]]
) -> None:
    records = {i: record() for i in range(nodes)}
    for i, end in bad.items():
        records[i] = refused(end, by or "no answer in time")
    found: dict[int, list[str]] = {}
    verdict = judge(HOSTS[:nodes], records, Thresholds())
    for n in verdict.named:
        found.setdefault(n.node_rank, []).append(n.line)
    assert found == expected
    (who,) = expected
    assert table(verdict)[1 + who].endswith("NAMED")


def test_a_refused_link_to_a_node_that_did_not_answer_names_it_once() -> None:
    records = {0: refused(PEER)}
    assert named(records | {2: record(), 3: record()}) == {
        1: ["node check: node 1 (h1, 10.0.0.2) did not answer the node check in time"]
    }


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ([], "phalanx check compares nodes: give --hosts/--hostfile"),
        (["--nnodes", "2", "--dry-run"], "phalanx check: --dry-run has no meaning here"),
        (["--nnodes", "2", "--node-check-thresholds", "compute=0.5"], "must be above 1"),
    ],
)
def test_check_usage_errors_are_one_line_exit_2(args: list[str], says: str) -> None:
    done = subprocess.run([*PHALANX, "check", *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("phalanx: error: ") and says in line, line


@pytest.mark.parametrize("prefix", ["--node", "--node-", "--node_", "--node-r"])
def test_torchruns_node_abbreviation_still_means_node_rank(prefix: str) -> None:
    """torchrun reads ``--node 1`` as ``--node-rank 1``; the node check's flags, which share
    the prefix, must not make it ambiguous (a torchrun command line keeps working)."""
    argv = expanded([prefix, "1", "--nnodes", "2", SCRIPT], {})
    assert argv[:2] == ["--node-rank", "1"]
    assert parse_config(argv, {}).rendezvous.node_rank == 1
    with pytest.raises(UsageError, match="ambiguous option: --n could match"):
        expanded(["--n", "1", SCRIPT], {})


def test_the_cpu_probe_asks_between_its_reps_and_gives_up_once_needed() -> None:
    """A probe ahead (a spare's, while it waits) asks ``needed`` before each rep: unneeded it
    measures all ``REPS``; once a round waits for the node it stops there, with no figure."""
    from phalanx.nodecheck.probes import REPS, cpu_matmul_rate

    asks: list[int] = []
    assert (cpu_matmul_rate(lambda: bool(asks.append(1))) or 0) > 0
    assert len(asks) == REPS
    asks.clear()
    assert cpu_matmul_rate(lambda: bool(asks.append(1)) or len(asks) == 2) is None
    assert len(asks) == 2
