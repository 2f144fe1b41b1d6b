"""A one-way firewall and the node check (docs/explanation/faults.md; docs/how-to/nodes.md,
"Node check"): two real hosts (network namespaces), node 0's agent hosting the c10d store.
Node 1's namespace drops every inbound TCP connection (iptables) but those to the store's
port and the replies of its own connections, so node 1 reaches node 0 but nothing reaches
node 1: the workers' process group would hang in its start. The link 1 -> 0 works, 0 -> 1
cannot connect: the check names node 1 as the end that refused it, on both nodes, and
under ``warn`` the job starts; under ``exclude`` node 1 leaves (exit 69) and node 0 goes
on alone. And a link this node's own kernel will not send (a blackhole route) is put on
this node, not on the one it was to. Timeouts only catch hangs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from phalanx.exclusion import EXCLUDED_EXIT_CODE
from phalanx.resources.ports import free_port
from support.hosts import NamespaceHosts, Node
from support.launch import worker
from support.netns import NetNamespaces

HANG = 180.0
TOKEN = {"PHALANX_RDZV_TOKEN": "node-check-firewall-token"}
REFUSED = re.compile(r"node check: node \d+ \([^,]*, ([^)]+)\) refused the link from node \d+")
NAMED = re.compile(r"^(?:phalanx: )?node check: node \d+ \([^,]*, ([^)]+)\)", re.M)


def one_way_firewall(spaces: NetNamespaces, i: int, store_port: int) -> None:
    """Node i drops inbound TCP connections on its eth0 but to ``store_port`` (and the
    packets of connections it opened). Removed with the namespace."""
    rules = [
        ["-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"],
        ["-p", "tcp", "--dport", str(store_port), "-j", "ACCEPT"],
        ["-p", "tcp", "-j", "DROP"],
    ]
    for rule in rules:
        argv = ["iptables", "-A", "INPUT", "-i", "eth0", *rule]
        subprocess.run(spaces.command(i, argv), check=True, capture_output=True)


def start(
    spaces: NetNamespaces, nodes: list[Node], tmp: Path, run_id: str, extra: list[str]
) -> int:
    """Both agents (node 0 hosts the store) with ``extra`` flags; returns the store's port."""
    net = NamespaceHosts(spaces)
    port = free_port()
    one_way_firewall(spaces, 1, port)
    for i in (0, 1):
        conf = f"join_timeout=60,last_call_timeout=1,is_host={str(i == 0).lower()}"
        args = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"{spaces.addr(0)}:{port}",
                "--rdzv-id", run_id, "--rdzv-conf", conf, "--nproc-per-node", "1",
                "--cold-start", *extra, worker("echo_args.py")]  # fmt: skip
        nodes.append(Node(net, i, args, tmp, f"n{i}", env=TOKEN))
    return port


@pytest.mark.slow
def test_a_node_that_drops_inbound_connections_is_named_and_the_job_starts(
    netns: Callable[[int], NetNamespaces], nodes: list[Node], tmp_path: Path
) -> None:
    """``--node-check warn``: both nodes name node 1 (and only node 1) as the end that
    refused the link, and the job runs to its end on both."""
    spaces = netns(2)
    start(spaces, nodes, tmp_path, "oneway", ["--nnodes", "2"])
    codes = [n.finish(HANG) for n in nodes]
    assert codes == [0, 0], nodes[0].stderr + nodes[1].stderr
    for node in nodes:
        assert set(REFUSED.findall(node.stderr)) == {spaces.addr(1)}, node.stderr
        assert set(NAMED.findall(node.stderr)) == {spaces.addr(1)}, node.stderr
        assert '"rank"' in node.stdout, node.stdout


@pytest.mark.slow
def test_a_node_that_drops_inbound_connections_leaves_under_exclude(
    netns: Callable[[int], NetNamespaces], nodes: list[Node], tmp_path: Path
) -> None:
    """``--node-check exclude`` in a 1:2 job: node 1 exits 69 with the line that it is
    excluded; node 0 forms a round of one and finishes."""
    spaces = netns(2)
    start(spaces, nodes, tmp_path, "oneway-x", ["--nnodes", "1:2", "--node-check", "exclude"])
    codes = [n.finish(HANG) for n in nodes]
    assert codes == [0, EXCLUDED_EXIT_CODE], nodes[0].stderr + nodes[1].stderr
    last = nodes[1].stderr.strip().splitlines()[-1]
    assert last.startswith("phalanx: node check: this node") and "is excluded" in last, last
    assert set(REFUSED.findall(nodes[1].stderr)) == {spaces.addr(1)}, nodes[1].stderr
    assert "world size 1" in nodes[0].stderr, nodes[0].stderr
    assert '"rank"' in nodes[0].stdout, nodes[0].stdout


# The link test from inside a namespace, to an address its own routes send nowhere.
LINK_TO = (
    "import json, sys; from phalanx.nodecheck.link import test_link; "
    "print(json.dumps(test_link(sys.argv[1], 9, bytes(16)).to_json()))"
)


def test_a_link_this_nodes_own_kernel_will_not_send_is_put_on_this_node(
    netns: Callable[[int], NetNamespaces],
) -> None:
    """A blackhole route on node 0 to node 1's address: the connect fails on node 0 before a
    packet leaves, so the link says this end refused it (``self``), not the peer."""
    spaces = netns(2)
    route = ["ip", "route", "add", "blackhole", f"{spaces.addr(1)}/32"]
    subprocess.run(spaces.command(0, route), check=True, capture_output=True)
    done = subprocess.run(
        spaces.command(0, [sys.executable, "-c", LINK_TO, spaces.addr(1)]),
        capture_output=True, text=True, timeout=HANG,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    link = json.loads(done.stdout)
    assert link["refused_by"] == "self" and link["latency_ms"] is None, link
