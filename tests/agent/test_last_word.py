"""The last word (``phalanx.rendezvous.lastword``): when an agent dies without leaving, its
guardian writes ``DIED`` into the node's liveness key and the others count the node lost at
once, not after ``heartbeat_timeout`` / ``lease_ttl``.

Tier (a)/(b): the verdict on ``DIED``, the sweep, the handler's word. Tier (c): a real
guardian of a real process that is SIGKILLed, against a real agent store; then real agents
(c10d on network-namespace hosts, etcd with a real server) whose agent is SIGKILLed with
``heartbeat_timeout=60`` / ``lease_ttl=30``, so only the last word can re-form the job in
time; and a node that stops on SIGTERM, which must not be said to have died."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from phalanx.rendezvous import lastword
from phalanx.rendezvous.dynamic.board import DIED, LEFT, Board
from phalanx.rendezvous.dynamic.handler import DynamicRendezvous
from phalanx.rendezvous.dynamic.keys import Keys
from phalanx.rendezvous.dynamic.pulse import DIED_REASON, Counters, Leases, Verdict
from phalanx.rendezvous.dynamic.sweep import _forget_heartbeat
from phalanx.rendezvous.settings import RendezvousSettings
from phalanx.rendezvous.stores.agentstore import AgentKVStore, Token
from phalanx.rendezvous.stores.etcd.conf import run_prefix
from phalanx.resources.ports import free_port
from support.etcd_server import EtcdCluster
from support.hosts import Loopback, NamespaceHosts, Node
from support.launch import alive, wait_for, worker
from support.memory_store import LeasedMemoryStore, MemoryServer, MemoryStore
from support.tools import needs_etcd

SETTINGS = RendezvousSettings(heartbeat_interval=0.5, heartbeat_timeout=60.0)
TOKEN = "lastword-secret"
REFORM_WITHIN = 20.0  # s from the SIGKILL; without the last word it takes 60 (30 on etcd)
HANG = 120.0
FENCED = "phalanx: rendezvous: fenced: no store write confirmed this node alive"


# -- tier (a)/(b): the verdict, the sweep, the handler's word --------------------------------


@pytest.mark.parametrize("kind", ["counters", "leases"])
def test_a_node_said_dead_is_lost_at_once(kind: str) -> None:
    server, keys = MemoryServer(), Keys("job")
    store = LeasedMemoryStore(server, lease_ttl=30) if kind == "leases" else MemoryStore(server)
    board = Board(store, keys, "watcher")
    pulse = (
        Leases(board, store) if isinstance(store, LeasedMemoryStore) else Counters(board, SETTINGS)
    )
    store.set(keys.heartbeat("dead"), DIED)
    assert pulse.judge("dead", time.monotonic()) == (Verdict.LOST, DIED_REASON)
    store.set(keys.heartbeat("gone"), LEFT)
    assert pulse.judge("gone", time.monotonic())[0] is Verdict.LEFT


def test_the_sweep_removes_a_died_key_from_a_leased_store() -> None:
    """``DIED`` is a plain write, bound to no lease: nothing else would ever remove it."""
    server, keys = MemoryServer(), Keys("job")
    store = LeasedMemoryStore(server, lease_ttl=30)
    board = Board(store, keys, "sweeper")
    store.set(keys.heartbeat("dead"), DIED)
    store.set_ephemeral(keys.heartbeat("spare"), b"alive")  # a spare's lease: kept
    _forget_heartbeat(board, "dead")
    _forget_heartbeat(board, "spare")
    assert store.get(keys.heartbeat("dead")) is None
    assert store.get(keys.heartbeat("spare")) is not None


@pytest.mark.parametrize("hosting", [False, True], ids=["client", "store-host"])
def test_the_handler_gives_its_word_unless_it_hosts_the_store(hosting: bool) -> None:
    reach = lastword.agent_store("10.0.0.1", 29400, Token(TOKEN.encode()))
    handler = DynamicRendezvous(
        MemoryStore(MemoryServer(), hosting=hosting), run_id="job", min_nodes=1, max_nodes=2,
        addr="10.0.0.2", settings=SETTINGS, reach=reach,
    )  # fmt: skip
    heard: list[dict[str, object] | None] = []
    handler.on_last_word(heard.append)
    if hosting:
        assert heard == [None]  # the store dies with this agent: nobody would hear it
        return
    [said] = heard
    assert said is not None
    assert (said["node_id"], said["run_id"], said["reach"]) == (handler.node_id, "job", reach)
    assert json.loads(json.dumps(said)) == said  # it travels as JSON


# -- tier (c): a real guardian of a real process ---------------------------------------------


@pytest.fixture
def store() -> Iterator[AgentKVStore]:
    hosted = AgentKVStore.host("127.0.0.1", 0, token=Token(TOKEN.encode()), read_timeout=5)
    try:
        yield hosted
    finally:
        hosted.close()


def _stand_in(store: AgentKVStore, *extra: str) -> tuple[subprocess.Popen[str], int, str]:
    """A process that starts a guardian and gives it its word; (it, the guardian's pid, the
    liveness key the word names)."""
    reach = lastword.agent_store("127.0.0.1", store.port, Token(TOKEN.encode()))
    said = lastword.word(reach, "job", "node-b")
    proc = subprocess.Popen(
        [sys.executable, worker("guardian_agent.py"), json.dumps(said), *extra],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline()), Keys("job").heartbeat("node-b")


def test_the_guardian_of_a_sigkilled_agent_says_it_died(store: AgentKVStore) -> None:
    proc, guardian, key = _stand_in(store)
    try:
        environ = Path(f"/proc/{guardian}/environ").read_bytes()
        assert TOKEN.encode() not in environ  # the word came over the pipe
        proc.kill()
        proc.wait(10)
        wait_for(lambda: not alive(guardian), 10, "the guardian to say its word and exit")
        assert store.get(key) == DIED
    finally:
        proc.kill()
        proc.wait(10)


def test_a_replaced_guardian_still_says_the_word(store: AgentKVStore) -> None:
    """The guardian is SIGKILLed first: the agent starts a new one and tells it the word in
    force (``supervisor.guardian``), which it says when the agent is SIGKILLed in turn."""
    proc, first, key = _stand_in(store)
    try:
        os.kill(first, signal.SIGKILL)

        def replacement() -> int | None:
            for child in psutil.Process(proc.pid).children():
                if child.pid != first and child.cmdline()[1:3] == ["-I", "-S"]:
                    return child.pid
            return None

        wait_for(lambda: replacement() is not None, 10, "the guardian's replacement")
        second = replacement()
        assert second is not None
        proc.kill()
        proc.wait(10)
        wait_for(lambda: not alive(second), 10, "the new guardian to say its word and exit")
        assert store.get(key) == DIED
    finally:
        proc.kill()
        proc.wait(10)


def test_an_agent_that_leaves_normally_is_not_said_to_have_died(store: AgentKVStore) -> None:
    proc, guardian, key = _stand_in(store, "close")
    proc.communicate("", timeout=10)  # EOF: it closes its guardian ("=") and exits
    assert proc.returncode == 0
    wait_for(lambda: not alive(guardian), 10, "the guardian to exit")
    assert store.get(key) is None


# -- tier (c): real agents, one SIGKILLed --------------------------------------------------------


def _session(pid: int) -> list[int]:
    """Every live process of the session ``pid`` leads (an agent's: its guardian, workers)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if os.getsid(proc.pid) == pid and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except (OSError, psutil.Error):
            pass
    return found


def _reformed_alone(stderr: str) -> bool:
    """The round after the loss formed: node 0 alone, the restart spent."""
    return any(
        line.startswith("phalanx: rendezvous ") and "node rank 0 of 1," in line
        and line.endswith("restart 1")
        for line in stderr.splitlines()
    )  # fmt: skip


def _kill_and_time_reform(nodes: list[Node], pids: Path) -> tuple[float, float]:
    """Wait for both nodes' first workers, SIGKILL node 1's agent (only the agent: its
    guardian is on its own), and time how long node 0 takes to say node 1 died and to
    re-form alone. Fails at ``REFORM_WITHIN`` s."""
    survivor, victim = nodes

    def running(predicate: Callable[[], bool]) -> Callable[[], bool]:
        def check() -> bool:
            if predicate():
                return True
            if survivor.proc.poll() is not None:
                raise AssertionError(f"node 0 exited early:\n{survivor.stderr}")
            return False

        return check

    first = [pids / f"{tag}-0-worker.pid" for tag in "ab"]
    wait_for(running(lambda: all(p.exists() for p in first)), HANG, "both nodes' workers")
    session = victim.proc.pid
    killed = time.monotonic()
    victim.proc.kill()
    victim.proc.wait(10)
    wait_for(running(lambda: DIED_REASON in survivor.stderr), REFORM_WITHIN,
             "node 0 to hear that node 1's agent died")  # fmt: skip
    said = time.monotonic() - killed
    left = REFORM_WITHIN - said
    wait_for(running(lambda: _reformed_alone(survivor.stderr)), left, "node 0 to re-form alone")
    reformed = time.monotonic() - killed
    print(f"node 1 counted lost {said:.1f} s after its SIGKILL; re-formed after {reformed:.1f} s")
    # The guardian still ends what the dead agent started, then itself.
    wait_for(lambda: not _session(session), 10, "every process of node 1 to be gone")
    for name in ("worker", "child"):
        assert not alive(int((pids / f"b-0-{name}.pid").read_text()))
    return said, reformed


def _c10d(net: Loopback | NamespaceHosts, port: int, i: int) -> list[str]:
    conf = (
        "heartbeat_interval=0.5,heartbeat_timeout=60,last_call_timeout=1,join_timeout=60,"
        f"exit_barrier_timeout=30,is_host={'true' if i == 0 else 'false'}"
    )
    return [
        "--nnodes", "1:2", "--nproc-per-node", "1", "--max-restarts", "1",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{net.addr(0)}:{port}",
        "--rdzv-id", "lastword", "--rdzv-conf", conf,
    ]  # fmt: skip


def test_c10d_node_whose_agent_is_sigkilled_is_lost_at_once(
    hosts: object, nodes: list[Node], tmp_path: Path
) -> None:
    """heartbeat_timeout=60: node 0 re-forms alone within 20 s only through the last word."""
    net = hosts(2)  # type: ignore[operator]
    port = free_port()
    pids = tmp_path / "pids"
    pids.mkdir()
    for i, tag in enumerate("ab"):
        env = {"LASTWORD_TAG": tag, "PHALANX_RDZV_TOKEN": TOKEN}
        args = [*_c10d(net, port, i), worker("first_attempt_waits.py"), str(pids)]
        nodes.append(Node(net, i, args, tmp_path, f"n{i}", env=env))
        if i == 0:  # the store's host first: node 1 is the client with a last word
            wait_for(lambda: "rendezvous" in nodes[0].stderr, HANG, "node 0 to host the store")
    _kill_and_time_reform(nodes, pids)
    assert nodes[0].finish(HANG) == 0, nodes[0].stderr
    assert nodes[0].stdout.strip().endswith("world=1 restart=1"), nodes[0].stdout
    assert "sent no heartbeat" not in nodes[0].stderr


# -- etcd ----------------------------------------------------------------------------------------

ETCD_CONF = (
    "lease_ttl=30,request_timeout=4,heartbeat_interval=0.5,heartbeat_timeout=8,"
    "last_call_timeout=1,join_timeout=60,exit_barrier_timeout=30"
)


@pytest.fixture
def etcd() -> Iterator[EtcdCluster]:
    with EtcdCluster(size=1) as cluster:
        yield cluster


def _etcd_nodes(etcd: EtcdCluster, nodes: list[Node], tmp: Path, run_id: str) -> Path:
    pids = tmp / "pids"
    pids.mkdir()
    for i, tag in enumerate("ab"):
        args = [
            "--nnodes", "1:2", "--nproc-per-node", "1", "--max-restarts", "1",
            "--rdzv-backend", "etcd", "--rdzv-endpoint", etcd.endpoints[0].removeprefix("http://"),
            "--rdzv-id", run_id, "--rdzv-conf", ETCD_CONF,
            worker("first_attempt_waits.py"), str(pids),
        ]  # fmt: skip
        nodes.append(Node(Loopback(), i, args, tmp, f"n{i}", env={"LASTWORD_TAG": tag}))
        if i == 0:  # node 0 first, so that it gets node rank 0 and re-forms as "node rank 0"
            wait_for(lambda: "rendezvous" in nodes[0].stderr, HANG, "node 0 to reach etcd")
    return pids


def _liveness_values(etcd: EtcdCluster, run_id: str) -> list[bytes]:
    """Every node's liveness value in etcd now."""
    return list(etcd.under(run_prefix(run_id) + "kv/" + Keys(run_id).heartbeat("")).values())


@needs_etcd
def test_etcd_node_whose_agent_is_sigkilled_is_lost_at_once(
    etcd: EtcdCluster, nodes: list[Node], tmp_path: Path
) -> None:
    """lease_ttl=30: node 0 re-forms alone within 20 s only through the last word."""
    pids = _etcd_nodes(etcd, nodes, tmp_path, "lastword-etcd")
    _kill_and_time_reform(nodes, pids)
    assert nodes[0].finish(HANG) == 0, nodes[0].stderr
    assert nodes[0].stdout.strip().endswith("world=1 restart=1"), nodes[0].stdout
    assert "lost its lease" not in nodes[0].stderr


@needs_etcd
def test_etcd_node_stopped_by_sigterm_is_not_said_to_have_died(
    etcd: EtcdCluster, nodes: list[Node], tmp_path: Path
) -> None:
    """A node that stops on SIGTERM leaves on purpose: its key reads ``left`` (or is gone
    with the run's keys), never ``died``, while both agents end."""
    run_id = "lastword-term"
    pids = _etcd_nodes(etcd, nodes, tmp_path, run_id)
    first = [pids / f"{tag}-0-worker.pid" for tag in "ab"]
    wait_for(lambda: all(p.exists() for p in first), HANG, "both nodes' workers")
    nodes[1].proc.send_signal(signal.SIGTERM)
    seen: set[bytes] = set()
    deadline = time.monotonic() + HANG
    while any(n.proc.poll() is None for n in nodes) and time.monotonic() < deadline:
        seen.update(_liveness_values(etcd, run_id))
        time.sleep(0.02)
    seen.update(_liveness_values(etcd, run_id))
    assert all(n.proc.poll() is not None for n in nodes), "an agent did not end"
    assert DIED not in seen, seen
    assert DIED_REASON not in nodes[0].stderr, nodes[0].stderr


def test_a_node_that_rejoined_under_a_new_id_is_still_said_to_have_died(
    nodes: list[Node], tmp_path: Path
) -> None:
    """The word names the node id, and a node that lost the store and came back is a new
    member with a new id (``tests/rendezvous/test_rejoin.py``: node 0's agent, the store's host, paused
    for longer than fence_after): its guardian must say the new one, or node 0 would wait
    for the heartbeat timeout (and say so) instead."""
    shared = tmp_path / "shared"
    shared.mkdir()
    port = free_port()
    for i in (0, 1):
        args = [
            "--nnodes", "1:2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "rejoin",
            "--rdzv-conf", f"is_host={'true' if i == 0 else 'false'}", "--max-restarts", "3",
            worker("lossy_steps.py"), str(shared),
        ]  # fmt: skip
        nodes.append(Node(Loopback(), i, args, tmp_path, f"n{i}"))
    wait_for(lambda: len(list(shared.glob("r[01]-0.steps"))) == 2, HANG, "both ranks to step")
    os.kill(nodes[0].proc.pid, signal.SIGSTOP)
    paused = time.monotonic()
    try:
        # The fault's length: > fence_after (8 s with the defaults), and on until node 1 has
        # fenced itself: on a loaded machine its fence can come later than 9 s, and a fault
        # ended before it makes no new member (node 1 then waits for a rejoin that never is).
        wait_for(
            lambda: time.monotonic() - paused >= 9.0 and FENCED in nodes[1].stderr,
            HANG,
            "node 1 to fence itself while node 0 is paused",
        )
    finally:
        os.kill(nodes[0].proc.pid, signal.SIGCONT)

    def rejoined() -> bool:
        _, _, after = nodes[1].stderr.partition("rejoining as a new member")
        return "rendezvous 'rejoin' round" in after

    wait_for(rejoined, HANG, "node 1 to rejoin as a new member, and a round to form")
    wait_for(lambda: len(list(shared.glob("r1-[1-9].steps"))) > 0, HANG, "the new round to step")
    killed = time.monotonic()
    nodes[1].proc.kill()
    wait_for(lambda: DIED_REASON in nodes[0].stderr, REFORM_WITHIN, "node 0 to hear it died")
    print(f"node 1 (rejoined) counted lost {time.monotonic() - killed:.1f} s after its SIGKILL")
    (shared / "stop").write_text("")
    assert nodes[0].finish(HANG) == 0, nodes[0].stderr
