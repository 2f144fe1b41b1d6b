"""Fencing (docs/explanation/design.md, "Fencing"): a node cut off from the store SIGKILLs its workers before the
others can form the next round without it.

Tier (a): the timing, as a table, and the settings refused for it (one line, exit 2).
Tier (c): the ``Fence`` against real process groups; and partitions of real hosts (network
namespaces, ``tests/support/netns.py``): an elastic job (``--nnodes 1:2``, one worker per
node) whose node 1 is taken off the network, once with the c10d store hosted on node 0 (the
side that survives) and once with a real etcd server on node 0's host. Every worker stamps
``time.monotonic()`` into a file every 10 ms (``tests/workers/fence_stamp.py``; one machine,
so one clock): the cut-off node's last stamp must come before the first start of any worker
of the round the survivor forms. Timeouts only catch hangs; nothing asserts a duration.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from phalanx.rendezvous.dynamic.board import Board
from phalanx.rendezvous.dynamic.keys import Keys
from phalanx.rendezvous.dynamic.pulse import Counters, Verdict
from phalanx.rendezvous.fencing import (
    KILL_BOUND,
    MARGIN,
    Fence,
    counters_timing,
    lease_timing,
    timing_problem,
)
from phalanx.rendezvous.settings import RendezvousSettings
from phalanx.rendezvous.stores.agentstore import AgentKVStore, Token
from phalanx.rendezvous.stores.etcd.conf import EtcdOptions
from phalanx.rendezvous.stores.etcd.store import EtcdStore
from phalanx.resources.ports import free_port
from support.etcd_server import EtcdCluster
from support.hosts import Loopback, NamespaceHosts, Node
from support.launch import alive, run_phalanx, wait_for, worker
from support.memory_store import MemoryServer, MemoryStore
from support.netns import NetNamespaces
from support.slow_replies import SlowReplies
from support.tools import needs_etcd

HANG = 90.0


# -- tier (a): the timing ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("interval", "timeout", "fence_after"),
    [
        (1.0, 10.0, 8.0),  # the defaults
        (0.5, 4.0, 2.0),  # the multi-node tests' settings
        (1.0, 4.0, 2.0),  # the least heartbeat_timeout for a 1 s heartbeat
    ],
)
def test_counters_fence_before_the_survivors_wait(
    interval: float, timeout: float, fence_after: float
) -> None:
    timing = counters_timing(interval, timeout)
    assert timing.fence_after == fence_after
    assert timing.fence_after + KILL_BOUND + MARGIN <= timing.wait == timeout
    assert timing_problem(timing) is None


@pytest.mark.parametrize(
    ("lease_ttl", "ttl", "fence_after", "renew_every"),
    [
        (10.0, 10, 8.0, 8.0 / 3),  # the default: renewed three times per fence_after
        (4.0, 4, 2.0, 2.0 / 3),
        (3.4, 3, 1.0, 1.0 / 3),  # etcd is asked for whole seconds
        (30.0, 30, 28.0, 28.0 / 3),
    ],
)
def test_leases_fence_before_they_expire(
    lease_ttl: float, ttl: int, fence_after: float, renew_every: float
) -> None:
    timing = lease_timing(lease_ttl)
    assert timing.wait == ttl
    assert timing.fence_after == fence_after
    assert timing.beat == pytest.approx(renew_every)
    assert timing.fence_after + KILL_BOUND + MARGIN <= timing.wait
    assert timing_problem(timing) is None


@pytest.mark.parametrize(
    ("conf", "said"),
    [
        (
            "heartbeat_interval=1,heartbeat_timeout=3",
            "--rdzv-conf heartbeat_timeout=3: too short to fence",
        ),
        (
            "heartbeat_interval=0.5,heartbeat_timeout=2.5",
            "--rdzv-conf heartbeat_timeout=2.5: too short to fence",
        ),
    ],
)
def test_c10d_settings_that_leave_no_time_to_fence_are_refused(
    conf: str, said: str, tmp_path: Path
) -> None:
    args = ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:1",
            "--rdzv-conf", conf, "--log-dir", str(tmp_path), worker("echo_args.py")]  # fmt: skip
    done = run_phalanx(args, timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and said in lines[0], done.stderr
    assert "give heartbeat_timeout >= " in lines[0] and "Traceback" not in done.stderr


def test_an_etcd_lease_too_short_to_fence_is_refused(tmp_path: Path) -> None:
    args = ["--nnodes", "2", "--rdzv-backend", "etcd", "--rdzv-endpoint", "127.0.0.1:1",
            "--rdzv-conf", "lease_ttl=2", "--log-dir", str(tmp_path),
            worker("echo_args.py")]  # fmt: skip
    done = run_phalanx(args, timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "--rdzv-conf lease_ttl=2: too short to fence" in lines[0]
    assert "give lease_ttl >= 3" in lines[0]


# -- tier (b): the survivors' side, on a fake clock ------------------------------------------
class SlowReads(MemoryStore):
    """A store whose reads take ``delay`` seconds of the fake ``clock``."""

    def __init__(self, server: MemoryServer, clock: list[float], delay: float) -> None:
        super().__init__(server)
        self._clock, self.delay = clock, delay

    def get(self, key: str) -> bytes | None:
        self._clock[0] += self.delay
        return super().get(key)


def test_a_watcher_counts_silence_from_after_the_read_that_showed_the_value() -> None:
    """The watcher's tick time is taken before its reads; a slow read must not let the
    silence start before the node's write did (the fence counts from that write)."""
    settings = RendezvousSettings(heartbeat_interval=1.0, heartbeat_timeout=10.0)
    server, clock = MemoryServer(), [1000.0]
    keys = Keys("job")
    writer = Counters(Board(MemoryStore(server), keys, "node-b"), settings)
    store = SlowReads(server, clock, delay=5.0)
    watcher = Counters(Board(store, keys, "node-a"), settings, clock=lambda: clock[0])
    writer.beat(True)
    tick = clock[0]
    assert watcher.judge("node-b", tick)[0] is Verdict.ALIVE  # read at 1005, value new
    store.delay = 0.0
    clock[0] = tick + settings.heartbeat_timeout + 1  # 11 s after the tick, 6 after the read
    assert watcher.judge("node-b", clock[0])[0] is not Verdict.LOST
    clock[0] = tick + 5.0 + settings.heartbeat_timeout
    assert watcher.judge("node-b", clock[0])[0] is Verdict.LOST


# -- tier (c): the Fence against real processes -----------------------------------------------
@pytest.fixture
def sleepers() -> Iterator[Callable[[], subprocess.Popen[bytes]]]:
    """``start()`` a ``sleep 60`` in a process group of its own; all are killed after."""
    started: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(["sleep", "60"], process_group=0)
        started.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in started:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def test_a_fence_whose_proofs_stop_kills_every_guarded_group(
    sleepers: Callable[[], subprocess.Popen[bytes]],
) -> None:
    fence = Fence(counters_timing(0.1, 2.0 + 0.5))  # fence_after 0.5 s
    guarded, other = sleepers(), sleepers()
    fence.guard(guarded.pid)
    fence.proved_alive(time.monotonic())  # the last proof: nothing follows it
    assert guarded.wait(HANG) == -signal.SIGKILL
    assert fence.reason is not None and fence.reason.startswith("fenced: ")
    assert other.poll() is None  # only what it guards
    late = sleepers()
    fence.guard(late.pid)  # a worker started after the fence fired dies at once
    assert late.wait(HANG) == -signal.SIGKILL


def test_a_fence_that_stood_down_kills_nothing(
    sleepers: Callable[[], subprocess.Popen[bytes]],
) -> None:
    fence = Fence(counters_timing(0.1, 2.0 + 0.3))
    proc = sleepers()
    fence.guard(proc.pid)
    fence.proved_alive(time.monotonic())
    fence.stand_down()  # the node left on purpose
    time.sleep(1.0)  # well past fence_after
    assert fence.reason is None and proc.poll() is None


def test_a_spare_paused_while_it_waited_arms_its_fence_only_when_it_arrives(
    sleepers: Callable[[], subprocess.Popen[bytes]],
) -> None:
    """A node that is no member yet stands its fence down while it waits: beats then arm
    nothing, so a pause past fence_after fires nothing; ``arrived`` arms it from that moment,
    and it still fires when the proofs stop after it (a fake clock: the thread never runs)."""
    now = [100.0]
    fence = Fence(counters_timing(0.1, 2.0 + 5.0), clock=lambda: now[0])  # fence_after 5 s
    fence.proved_alive(100.0)  # a beat before the round
    fence.stand_down()  # waiting as a spare
    now[0] = 110.0  # frozen 10 s, then a late beat
    fence.proved_alive(101.0)
    assert fence.reason is None
    fence.arrived()  # chosen: it takes its slot at 110
    proc = sleepers()
    fence.guard(proc.pid)
    now[0] = 114.0
    fence.proved_alive(113.0)  # in time: counts from 113
    assert fence.reason is None and proc.poll() is None
    now[0] = 119.0
    fence.proved_alive(118.5)  # after the deadline (118): fires
    assert proc.wait(HANG) == -signal.SIGKILL


def test_a_stale_proof_delivered_while_a_spare_arrives_does_not_fire_the_fence(
    sleepers: Callable[[], subprocess.Popen[bytes]],
) -> None:
    """A spare paused while it waited (its fence stood down) arrives in a round; at that
    moment its beat thread delivers a proof whose write began before the pause. Whenever it
    lands, it must not count: arming and its clock read are one step, and a proof that
    began before it is stale (the beat thread is made to deliver it just as ``arrived``
    reads the clock; a fake clock, so the fence's own thread never fires first)."""
    now = [100.0]
    late: list[threading.Thread] = []

    def clock() -> float:
        if arriving.is_set() and not late:  # the beat thread's proof, right now
            late.append(threading.Thread(target=fence.proved_alive, args=(101.0,)))
            late[0].start()
            late[0].join(0.5)  # (it waits for the lock where arming holds it)
        return now[0]

    arriving = threading.Event()
    fence = Fence(counters_timing(0.1, 2.0 + 5.0), clock=clock)  # fence_after 5 s
    fence.proved_alive(100.0)
    fence.stand_down()  # waiting as a spare
    now[0] = 110.0  # frozen 10 s
    arriving.set()
    fence.arrived()  # chosen: it takes its slot at 110
    late[0].join(HANG)
    proc = sleepers()
    fence.guard(proc.pid)
    assert fence.reason is None and proc.poll() is None
    now[0] = 114.0
    fence.proved_alive(113.0)
    assert fence.reason is None and proc.poll() is None


def test_a_proof_that_comes_after_the_deadline_fires_the_fence(
    sleepers: Callable[[], subprocess.Popen[bytes]],
) -> None:
    """A write that took longer than the survivors allow cannot count: by then they may have
    judged the node lost (a fake clock, so the fence's thread cannot fire first)."""
    now = [100.0]
    fence = Fence(counters_timing(0.1, 2.0 + 5.0), clock=lambda: now[0])  # fence_after 5 s
    proc = sleepers()
    fence.guard(proc.pid)
    fence.proved_alive(100.0)
    now[0] = 106.0  # the next write began at 101 but only answered at 106
    fence.proved_alive(101.0)
    assert proc.wait(HANG) == -signal.SIGKILL
    assert fence.reason is not None


def test_a_slow_proof_in_time_counts_from_when_its_write_began(
    sleepers: Callable[[], subprocess.Popen[bytes]],
) -> None:
    """A real agent store; the node's heartbeats go through a proxy whose answers can be
    slowed (``support/slow_replies.py``), a watcher reads the store directly. heartbeat_timeout
    6 s, so fence_after 4 s. The first beat answers at once; the second reaches the store at
    once but its answer takes 3 s: in time, so it counts -- from when it began, as the
    watcher's silence counts from about then too. Then no beat follows. The fence must kill
    the guarded group at least the kill bound before the watcher counts the node lost
    (counted from the answer instead, it would fire 3 s late, after the watcher)."""
    settings = RendezvousSettings(heartbeat_interval=1.0, heartbeat_timeout=6.0)
    timing = counters_timing(settings.heartbeat_interval, settings.heartbeat_timeout)
    token, keys = Token(b"fence"), Keys("fence")
    host = AgentKVStore.host("127.0.0.1", 0, token=token, read_timeout=30, linger=0)
    proxy = SlowReplies(host.port)
    node = AgentKVStore.connect(
        "127.0.0.1", proxy.port, token=token, connect_timeout=10, read_timeout=30
    )
    fence = Fence(timing)
    proc = sleepers()
    fence.guard(proc.pid)
    beats = Counters(Board(node, keys, "node-b"), settings, proved=fence.proved_alive)
    watcher = Counters(Board(host, keys, "node-a"), settings)
    lost: list[float] = []

    def watched_lost() -> bool:
        now = time.monotonic()
        if watcher.judge("node-b", now)[0] is Verdict.LOST:
            lost.append(now)
        return bool(lost)

    try:
        watched_lost()
        beats.beat(True)  # answered at once: the fence is armed
        proxy.delay = 3.0  # < fence_after: the next proof is slow but in time
        slow = threading.Thread(target=beats.beat, args=(True,), daemon=True)
        slow.start()
        wait_for(watched_lost, HANG, "the watcher to count node-b lost")
        slow.join(HANG)
        assert proc.wait(HANG) == -signal.SIGKILL
    finally:
        proxy.close()
        node.close()
        host.close()
    fired_at = fence.fired_at
    assert fired_at is not None and fence.reason is not None
    assert fired_at + KILL_BOUND <= lost[0], (fired_at, lost[0])


@needs_etcd
def test_the_etcd_lease_reports_each_renewal_as_often_as_fencing_asks() -> None:
    """A real etcd, a 30 s lease (etcd's own pace: a renewal every 10 s): asked for one every
    0.1 s, the store reports grant and renewals, each with the time its request was sent."""
    with EtcdCluster(size=1) as etcd:
        store = EtcdStore(etcd.endpoints, "/phalanx/runs/fence/", EtcdOptions(lease_ttl=30))
        proofs: list[tuple[float, float]] = []
        try:
            store.on_renewed(lambda sent: proofs.append((sent, time.monotonic())), every=0.1)
            assert store.lease_ttl == 30
            store.set_ephemeral("alive", b"1")
            wait_for(lambda: len(proofs) >= 5, 30, "a grant and four renewals")
        finally:
            store.close()
    assert all(sent <= answered for sent, answered in proofs)
    assert [sent for sent, _ in proofs] == sorted(sent for sent, _ in proofs)


# -- tier (c): partitions of real hosts -------------------------------------------------------
FAST = "heartbeat_interval=0.5,last_call_timeout=1,join_timeout=30,exit_barrier_timeout=10"
# With restarts left, a node that fenced itself waits for the store to answer again (to
# rejoin) for close_timeout (30 s by default) before it ends. Where the store stays out of
# reach (a link down, its host frozen), that is only how long the node takes to give up:
# 10 s, not half a minute per test (s56: the grace tests, without it, took 36-39 s each).
CUT_OFF = "close_timeout=10"


def stamp_files(directory: Path, label: str) -> list[tuple[float, float | None, int]]:
    """(start, last stamp or None, world size) of every worker ``label`` recorded."""
    found = []
    for path in sorted(directory.glob(f"{label}-*.stamps")):
        lines = path.read_text().splitlines()
        if not lines:  # the worker made its file and has not written its first line yet
            continue
        head = lines[0].split()
        stamps = [float(line) for line in lines[1:] if _is_number(line)]
        found.append((float(head[1]), max(stamps, default=None), int(head[2].split("=")[1])))
    return found


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def namespace_pids(spaces: NetNamespaces, i: int) -> list[int]:
    listed = subprocess.run(
        ["ip", "netns", "pids", spaces.names[i]], capture_output=True, text=True, check=True
    )
    return [int(pid) for pid in listed.stdout.split()]


def wait_for_a_round_of_two(nodes: list[Node], stamps: Path) -> None:
    def both_in_a_round_of_two() -> bool:
        for node in nodes:
            assert node.proc.poll() is None, node.stderr
        return all(
            any(world == 2 and last is not None for _, last, world in stamp_files(stamps, f"n{i}"))
            for i in (0, 1)
        )

    wait_for(both_in_a_round_of_two, HANG, "a round of two nodes with both workers stamping")


def cut_off_node_1(
    spaces: NetNamespaces, nodes: list[Node], stamps: Path, how: str, code: int = 1
) -> float:
    """Take node 1 off the network (``how``: ``link-down`` or ``drop``); it must exit ``code``
    (1; the root cause's code where a worker had failed before) with nothing left in its
    namespace, and node 0 must start a worker in a round of its own.
    Then node 0's workers are let finish. Returns the monotonic time of the cut."""
    cut = time.monotonic()
    spaces.cut(1) if how == "link-down" else spaces.drop(1)
    try:
        assert nodes[1].finish(HANG) == code, nodes[1].stderr
        wait_for(lambda: namespace_pids(spaces, 1) == [], 30, "node 1's namespace to be empty")

        def node_0_started_again() -> bool:
            assert nodes[0].proc.poll() is None, nodes[0].stderr
            return any(start > cut for start, _, _ in stamp_files(stamps, "n0"))

        wait_for(node_0_started_again, HANG, "node 0 to re-form alone and start a worker")
    finally:
        (stamps / "stop").touch()
    assert nodes[0].finish(HANG) == 0, nodes[0].stderr
    return cut


def partition_scenario(
    spaces: NetNamespaces,
    nodes: list[Node],
    tmp: Path,
    args_for: Callable[[int], list[str]],
    how: str,
    *,
    fenced_always: bool,
) -> None:
    """Both nodes run one worker each in a round of two; node 1 is taken off the network.
    Node 1 must fence (exit 1 naming it, nothing of it left in its namespace) and its
    workers' last stamp must come before the first start in node 0's next round.

    The workers go on after SIGTERM (a checkpoint save); node 1 would give them 10 s of it
    (``--shutdown-timeout``), so only a SIGKILL without grace keeps them from overlapping
    node 0's next round. Node 0 gives its own old worker 1 s.

    ``how``: ``link-down`` (node 1's veth end) or ``drop`` (its packets blackholed, so
    every store call of node 1 just waits: only the fence can end its workers in time)."""
    net = NamespaceHosts(spaces)
    stamps = tmp / "stamps"
    stamps.mkdir()
    for i in (0, 1):
        grace = ["--shutdown-timeout", "1" if i == 0 else "10"]
        # The node's name is its worker's argument: arguments that differ on purpose.
        tail = [*grace, "--allow-per-node-args", worker("fence_stamp.py"), str(stamps), f"n{i}"]
        nodes.append(Node(net, i, [*args_for(i), *tail], tmp, f"n{i}"))

    wait_for_a_round_of_two(nodes, stamps)
    cut = cut_off_node_1(spaces, nodes, stamps, how)

    old = stamp_files(stamps, "n1")
    assert old and all(start < cut for start, _, _ in old)
    new_starts = [start for start, _, world in stamp_files(stamps, "n0") if start > cut]
    assert new_starts and all(w == 1 for s, _, w in stamp_files(stamps, "n0") if s > cut)
    last_old = max(last for _, last, _ in old if last is not None)
    assert last_old < min(new_starts), (last_old, min(new_starts), nodes[1].stderr)
    print(f"cut {cut:.3f}, last old stamp {last_old:.3f}, first new start {min(new_starts):.3f}")

    # Node 1 says once why it stopped, in its last line; no traceback, no worker left.
    err = nodes[1].stderr
    last = err.strip().splitlines()[-1]
    if how == "drop" or fenced_always:
        assert "phalanx: rendezvous: fenced: no store write confirmed this node alive" in err, err
        assert last.startswith("phalanx: the job stopped: fenced: "), err
        assert "; the rendezvous store " in last, err  # and what became of the store
    else:  # a refused connection may show the store lost before the fence is due
        assert last.startswith(
            ("phalanx: the job stopped: fenced: ", "phalanx: the job stopped: the rendezvous store")
        ), err
    assert "Traceback" not in err
    # (its node rank may be 0 or 1: ranks follow the order of arrival)
    assert "(local rank 0) on " in err and "stopped by phalanx (killed by SIGKILL)" in err
    assert "was lost" in nodes[0].stderr, nodes[0].stderr


@pytest.mark.slow
def test_a_node_cut_off_from_the_c10d_store_is_fenced_before_the_others_re_form(
    netns: Callable[[int], NetNamespaces], nodes: list[Node], tmp_path: Path
) -> None:
    """The store lives in node 0's agent (the side that survives); node 1's link goes down.
    Its store calls then wait on a connection that gets no answer (nothing fails), so the
    fence is what stops its workers. heartbeat_timeout 4 s: node 1 fences 2 s after its
    last heartbeat began, node 0 counts it lost 4 s after. Node 1 then waits for the store to
    come back (``CUT_OFF``) before it ends."""
    spaces = netns(2)
    port = free_port()

    def args(i: int) -> list[str]:
        conf = f"{FAST},heartbeat_timeout=4,read_timeout=30,{CUT_OFF},is_host={str(i == 0).lower()}"
        return ["--nnodes", "1:2", "--nproc-per-node", "1", "--max-restarts", "3",
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{spaces.addr(0)}:{port}",
                "--rdzv-id", "fence-c10d", "--rdzv-conf", conf]  # fmt: skip

    partition_scenario(spaces, nodes, tmp_path, args, "link-down", fenced_always=True)


@pytest.mark.slow
def test_a_node_cut_off_during_its_workers_grace_is_fenced_all_the_same(
    netns: Callable[[int], NetNamespaces], nodes: list[Node], tmp_path: Path
) -> None:
    """Node 0's worker fails, so both nodes stop theirs: node 1 with SIGTERM and 600 s of
    grace, which its worker spends saving (it goes on stamping). Node 1 is cut off then: its
    fence SIGKILLs the worker in the middle of the grace, before node 0 re-forms alone."""
    spaces = netns(2)
    net = NamespaceHosts(spaces)
    port = free_port()
    stamps = tmp_path / "stamps"
    stamps.mkdir()
    for i in (0, 1):
        conf = f"{FAST},heartbeat_timeout=4,read_timeout=30,{CUT_OFF},is_host={str(i == 0).lower()}"
        args = ["--nnodes", "1:2", "--nproc-per-node", "1", "--max-restarts", "3",
                "--shutdown-timeout", "1" if i == 0 else "600",
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{spaces.addr(0)}:{port}",
                "--rdzv-id", "fence-grace", "--rdzv-conf", conf,
                "--allow-per-node-args", worker("fence_stamp.py"), str(stamps), f"n{i}"]  # fmt: skip
        nodes.append(Node(net, i, args, tmp_path, f"n{i}"))
    wait_for_a_round_of_two(nodes, stamps)
    (stamps / "fail").touch()

    def node_1_in_its_grace() -> bool:
        assert nodes[1].proc.poll() is None, nodes[1].stderr
        return any("sigterm" in p.read_text() for p in stamps.glob("n1-*.stamps"))

    wait_for(node_1_in_its_grace, HANG, "node 1's worker to get SIGTERM")
    # (its grace would be 600 s); node 0's worker failed with exit 3 first: the job's code
    cut = cut_off_node_1(spaces, nodes, stamps, "link-down", code=3)
    last_old = max(last for _, last, _ in stamp_files(stamps, "n1") if last is not None)
    first_new = min(start for start, _, _ in stamp_files(stamps, "n0") if start > cut)
    assert cut < last_old < first_new, (cut, last_old, first_new)  # stamped in its grace
    err = nodes[1].stderr
    assert "phalanx: rendezvous: fenced: no store write confirmed this node alive" in err, err
    assert "fenced: " in err.strip().splitlines()[-1] and "Traceback" not in err, err


def test_every_worker_is_guarded_by_the_fence_while_the_agent_waits_out_a_grace(
    nodes: list[Node], tmp_path: Path
) -> None:
    """Two agents on loopback (static: node 0 hosts the store). Rank 0 (node 0) exits 3;
    node 1 stops rank 1 with SIGTERM and 600 s of grace, which rank 1 ignores -- the agent
    then waits in its grace and looks at nothing else. Node 0, the store's host, is held
    (SIGSTOP) while it waits for node 1's verdict: node 1's heartbeats go unanswered, and
    only the fence's own thread can end rank 1, by the process group the supervisor gave it
    when it started the worker. It does, within the bound, and says it killed one group."""
    shared, port = tmp_path / "shared", free_port()
    shared.mkdir()
    for i in (0, 1):
        args = ["--nnodes", "2", "--node-rank", str(i), "--nproc-per-node", "1",
                "--master-addr", "127.0.0.1", "--master-port", str(port),
                "--max-restarts", "1", "--shutdown-timeout", "600" if i == 1 else "1",
                "--rdzv-conf", f"{FAST},heartbeat_timeout=4,read_timeout=30,{CUT_OFF}",
                worker("stubborn_then_fail.py"), str(shared), "1"]  # fmt: skip
        nodes.append(Node(Loopback(), i, args, tmp_path, f"n{i}"))

    def in_grace() -> bool:
        for node in nodes:
            assert node.proc.poll() is None, node.stderr
        return (shared / "sigterm").exists()

    wait_for(in_grace, HANG, "rank 1 to get SIGTERM (its grace: 600 s)")
    stubborn = int((shared / "stubborn.pid").read_text())
    os.kill(nodes[0].proc.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: not alive(stubborn), HANG, "the fence to SIGKILL rank 1 in its grace")
        code = nodes[1].finish(HANG)
    finally:
        os.kill(nodes[0].proc.pid, signal.SIGCONT)
        nodes[0].kill()
    err = nodes[1].stderr
    assert code == 3, err  # the job's root cause (rank 0's exit 3), as after any fence
    assert "phalanx: rendezvous: fenced: no store write confirmed this node alive" in err, err
    assert "(1 worker group(s) killed)" in err and "Traceback" not in err, err
    assert "stopped by phalanx (killed by SIGKILL)" in err, err


@pytest.mark.slow
@needs_etcd
@pytest.mark.parametrize("how", ["link-down", "drop"])
def test_a_node_cut_off_from_etcd_is_fenced_before_its_lease_expires(
    netns: Callable[[int], NetNamespaces], nodes: list[Node], tmp_path: Path, how: str
) -> None:
    """A real etcd on node 0's host (its namespace). lease_ttl 4 s: node 1 fences 2 s after
    its last renewal was sent; etcd drops its key 4 s after it took that renewal. With the
    link down a new connection is refused at once, so node 1 may find the store lost by its
    errors first (also a SIGKILL); with its packets dropped every call waits, and only the
    fence can be in time."""
    spaces = netns(2)
    with EtcdCluster(size=1, host=spaces.addr(0), prefix=tuple(spaces.command(0, []))) as etcd:
        endpoint = etcd.endpoints[0].removeprefix("http://")

        def args(i: int) -> list[str]:
            conf = f"{FAST},heartbeat_timeout=8,lease_ttl=4,request_timeout=4"
            return ["--nnodes", "1:2", "--nproc-per-node", "1", "--max-restarts", "3",
                    "--rdzv-backend", "etcd", "--rdzv-endpoint", endpoint,
                    "--rdzv-id", "fence-etcd", "--rdzv-conf", conf]  # fmt: skip

        try:
            partition_scenario(spaces, nodes, tmp_path, args, how, fenced_always=False)
        finally:
            for node in nodes:
                node.kill()  # before etcd stops: no agent waits on a vanished store


@pytest.mark.slow
def test_a_store_lost_by_its_errors_stops_the_workers_without_grace(
    netns: Callable[[int], NetNamespaces], nodes: list[Node], tmp_path: Path
) -> None:
    """The c10d store's host is SIGKILLed: node 1's connection is reset, its store calls
    fail at once and it finds the store lost by the errors (or its fence, whichever comes
    first). Its worker ignores SIGTERM and would get 600 s of grace: it is SIGKILLed instead,
    and node 1 exits 1 long before the grace could have run out (90 s only catches that)."""
    spaces = netns(2)
    net = NamespaceHosts(spaces)
    port = free_port()
    stamps = tmp_path / "stamps"
    stamps.mkdir()
    for i in (0, 1):
        conf = f"{FAST},heartbeat_timeout=4,is_host={str(i == 0).lower()}"
        args = ["--nnodes", "2", "--nproc-per-node", "1", "--shutdown-timeout", "600",
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{spaces.addr(0)}:{port}",
                "--rdzv-id", "lost-store", "--rdzv-conf", conf,
                "--allow-per-node-args", worker("fence_stamp.py"), str(stamps), f"n{i}"]  # fmt: skip
        nodes.append(Node(net, i, args, tmp_path, f"n{i}"))
    try:
        wait_for(lambda: all(stamp_files(stamps, f"n{i}") for i in (0, 1)), HANG, "both workers")
        nodes[0].kill()  # the store's host, its whole session
        assert nodes[1].finish(HANG) == 1, nodes[1].stderr
        wait_for(lambda: namespace_pids(spaces, 1) == [], 30, "node 1's namespace to be empty")
    finally:
        (stamps / "stop").touch()
    err = nodes[1].stderr
    assert "stopped by phalanx (killed by SIGKILL)" in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith(
        ("phalanx: the job stopped: the rendezvous store", "phalanx: the job stopped: fenced: ")
    ), err
