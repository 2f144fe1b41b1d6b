"""A member of a c10d job cut off from the others (docs/explanation/design.md, "When the
store's host is lost"): three agents at ``--nnodes 2:3`` (four at ``--nnodes 3`` with a
spare), each in a network namespace of its own; a member that does not host the store is
cut off by taking its link down, reaches no candidate and serves a store of its own. It
gets no quorum and stops in one line, or -- its link back while the job still runs -- goes
back to the job's store (``goback``). Split from ``test_store_failover.py`` so that the two
run on two pytest workers."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from phalanx.errors import CUT_OFF_EXIT_CODE
from support.failover import (
    CONF,
    HANG,
    PORT,
    STEPS,
    agent,
    events,
    reference_weights,
    start_three,
    then_fast,
    training,
    world_again,
)  # fmt: skip
from support.hosts import NamespaceHosts, Node
from support.launch import wait_for, worker
from support.multinode import c10d_args
from support.netns import NetNamespaces


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return reference_weights(tmp_path_factory)


def _said_cut_off(node: Node) -> None:
    """A node cut off from the other members said so last -- it is out, the job goes on
    without it where a quorum met -- and not that the job stopped; its event log and
    report say the same (``cut_off``, exit 79)."""
    last = node.stderr.strip().splitlines()[-1]
    assert last.startswith("phalanx: cut off: only 1 of the last round's 3 members reached the "
                           "store that took over after round "), last  # fmt: skip
    out = "this node is out of the job, which goes on without it on the side that reached a quorum"
    assert out in last and last.endswith("(exit 79)"), last
    assert "the job stopped" not in node.stderr and "job stopped after" not in node.stderr
    (said,) = events(node, "cut_off")
    assert said["reason"] == last.removeprefix("phalanx: "), said
    ((end,),) = [events(node, "job_end")]
    assert (end["outcome"], end["exit_code"]) == ("cut_off", 79), end
    report = json.loads(next(node.logs.rglob("report.json")).read_text())
    assert report["outcome"] == "cut_off" and report["ended"] == said["reason"], report
    assert [e["stopped_by_launcher"] for e in report["exits"]] == [True], report["exits"]


def _waits_to_rejoin(node: Node) -> bool:
    """Back at the job's store, it waits for a place (the round runs without it)."""
    err = node.stderr
    back = err.find("answers again: going back to it")
    return back >= 0 and "waiting to join: round" in err[back:]


@contextlib.contextmanager
def cut_until_it_serves(spaces: NetNamespaces, nodes: list[Node], i: int) -> Iterator[None]:
    """Node ``i``'s link down until it serves a store of its own (it reached no candidate:
    failover 1), and while the ``with`` body runs; its link back up after, whatever happens."""
    spaces.cut(i)
    try:
        served = lambda: "(failover 1) (this node)" in nodes[i].stderr  # noqa: E731
        wait_for(served, HANG, f"node {i} to serve a store of its own")
        yield
    finally:
        spaces.heal(i)


def test_a_member_cut_off_serves_a_store_no_newcomer_joins_and_it_stops(
    netns: Callable[[int], NetNamespaces], nodes: list[Node], tmp_path: Path, reference: bytes
) -> None:
    """The soak's case: node 2, which does not host the store, is cut off and reaches no
    candidate, so it serves a store of its own (failover 1). A newcomer started on its
    machine meanwhile (it reaches only that store) does not join it: no round of the job's
    members formed there (unconfirmed); node 2 gets no quorum of the last round's members
    and stops in one line; the link back, the newcomer joins the job where the two others
    went on, and exactly one round runs at a time: the job finishes bit-identical."""
    spaces = netns(3)
    hosts, shared = start_three(spaces, nodes, tmp_path, listed=True, delay="1.5")
    wait_for(training(nodes, shared), HANG, "all three nodes to train")
    with cut_until_it_serves(spaces, nodes, 2):
        newcomer = agent(hosts, 2, tmp_path, "2:3", True, "n2-new", delay="1.5")
        nodes.append(newcomer)
        said = ("is not confirmed", "joining it at", "round 1: node rank")
        wait_for(lambda: any(s in newcomer.stderr for s in said), HANG, "the newcomer to look")
        assert nodes[2].finish(HANG) == CUT_OFF_EXIT_CODE, nodes[2].stderr[-4000:]
    joined = lambda: "node rank" in newcomer.stderr or newcomer.proc.poll() is not None  # noqa: E731
    then_fast(shared, joined, "the newcomer to join the job")
    _said_cut_off(nodes[2])
    assert "round 1: node rank" not in nodes[2].stderr  # no round formed on its store
    assert f"store at {hosts.addr(2)}:{PORT} (failover 1) is not confirmed" in newcomer.stderr
    assert "joining it at" not in newcomer.stderr, newcomer.stderr[-4000:]
    for node in nodes[:2]:
        assert node.finish(HANG) == 0, node.stderr[-6000:]
        assert "serves the rendezvous store now" not in node.stderr  # the store stayed
    # It joined the job's store (then the job re-formed with it), or the job finished first.
    code = newcomer.finish(HANG)
    assert code == 0 or "the job finished while" in newcomer.stderr, newcomer.stderr[-4000:]
    assert "world=2" in (shared / "steps-1").read_text()  # the two went on without node 2
    assert (shared / "final.bin").read_bytes() == reference


def test_a_member_cut_off_for_a_moment_goes_back_to_the_jobs_store(
    netns: Callable[[int], NetNamespaces], nodes: list[Node], tmp_path: Path, reference: bytes
) -> None:
    """A link flap's case (the c10d soak's costliest fault): node 2, which does not host the
    store, is cut off, reaches no candidate and serves a store of its own (failover 1); its
    link back, it finds the store it lost answering again and goes back to it as a member of
    the last round -- before, it waited out the keepalive and the last call alone on its own
    store and left cut off (exit 79), and the job ran without it. The store never moved for
    the two others; all three finish, a later restart runs at world size 3 again, and the
    result is bit-identical."""
    spaces = netns(3)
    hosts, shared = start_three(spaces, nodes, tmp_path, listed=True, delay="1.5")
    wait_for(training(nodes, shared), HANG, "all three nodes to train")
    with cut_until_it_serves(spaces, nodes, 2):
        pass
    then_fast(shared, world_again(shared, 3), "a restart at world size 3")
    for node in nodes:
        assert node.finish(HANG) == 0, node.stderr[-6000:]
    said = f"the store this node lost, at {hosts.addr(0)}:{PORT}, answers again: going back"
    (back,) = [line for line in nodes[2].stderr.splitlines() if said in line]
    assert "leaving the store this node served (failover 1)" in back, back
    assert "cut off" not in nodes[2].stderr and not events(nodes[2], "cut_off")
    for node in nodes[:2]:
        assert "serves the rendezvous store now" not in node.stderr  # the store stayed
    assert world_again(shared, 3)(), list(shared.iterdir())  # node 2 trains again
    assert (shared / "final.bin").read_bytes() == reference


def test_a_member_back_too_late_for_a_place_ends_0_when_the_job_finishes(
    netns: Callable[[int], NetNamespaces], nodes: list[Node], tmp_path: Path, reference: bytes
) -> None:
    """The soak's shape: four agents at ``--nnodes 3`` (one a spare), every node a candidate.
    A member that does not host the store is cut off, serves a store of its own, and its
    link comes back; the others re-form with the spare at MAX, so it goes back to wait for a
    place. The job finishes without it: it ends with exit 0, "waited to rejoin" (it used to
    end 1, failed, in a job that succeeded), and every node ends 0."""
    spaces = netns(4)
    hosts, shared = NamespaceHosts(spaces), tmp_path / "shared"
    shared.mkdir()
    listed = ",".join(f"{hosts.addr(j)}:{PORT}" for j in range(4))
    for i in range(4):
        rdzv = c10d_args(hosts, PORT, "3", "failover", CONF)
        rdzv[rdzv.index("--rdzv-endpoint") + 1] = listed
        args = [*rdzv, "--max-restarts", "2", worker("failover_train.py"), str(shared), str(STEPS)]
        nodes.append(Node(hosts, i, args, tmp_path, env={"FAILOVER_STEP_DELAY": "0.5"}))
    wait_for(training(nodes, shared), HANG, "three nodes to train")
    member = next(i for i in (1, 2, 3) if "round 0: node rank" in nodes[i].stderr)
    with cut_until_it_serves(spaces, nodes, member):
        pass
    then_fast(shared, lambda: _waits_to_rejoin(nodes[member]), "it to wait for a place")
    assert [node.finish(HANG) for node in nodes] == [0, 0, 0, 0], nodes[member].stderr[-4000:]
    err = nodes[member].stderr
    assert "answers again: going back to it" in err, err[-4000:]
    assert (
        err.strip()
        .splitlines()[-1]
        .startswith("phalanx: the job finished while this node waited to rejoin (round ")
    ), err[-4000:]
    ((end,),) = [events(nodes[member], "job_end")]
    assert (end["outcome"], end["exit_code"]) == ("not_needed", 0), end
    assert (shared / "final.bin").read_bytes() == reference
