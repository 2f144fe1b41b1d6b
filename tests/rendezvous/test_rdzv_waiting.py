"""The waiting line: a node waiting for peers says who is there (``rendezvous.dynamic.
waiting``). The text from a table; real agents, the second started late, on c10d (a log:
plain lines) and etcd (a terminal: one line redrawn in place); when it is said, on an
in-memory store and an injected clock."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from phalanx.rendezvous.dynamic.board import Board
from phalanx.rendezvous.dynamic.keys import Keys
from phalanx.rendezvous.dynamic.records import encode
from phalanx.rendezvous.dynamic.waiting import Waiting, WaitingLine, waiting_text
from phalanx.resources.ports import free_port
from support.etcd_server import EtcdCluster
from support.hosts import Loopback, Node
from support.launch import run_phalanx, wait_for, worker
from support.memory_store import MemoryServer, MemoryStore
from support.tools import needs_etcd

HANG = 60.0
FAST = "heartbeat_interval=0.5,heartbeat_timeout=4,last_call_timeout=1,join_timeout=60"
JOB = [worker("steps_then_fail.py"), "1", "9", "0"]  # one step, no failure, no torch

TEXTS = [
    (Waiting(0, 1, ("hostA",)), 2, 2, 583.2,
     "phalanx: waiting for nodes: 1 of 2 present (hostA); 1 more needed; join timeout in 584 s"),
    (Waiting(0, 1, ("hostA",)), 3, 4, 10.0,
     "phalanx: waiting for nodes: 1 of 3..4 present (hostA); 2 more needed; join timeout in 10 s"),
    (Waiting(0, 0, ()), 2, 2, 5.0,
     "phalanx: waiting for nodes: 0 of 2 present; 2 more needed; join timeout in 5 s"),
    (Waiting(2, 10, ("a", "b")), 2, 16, 1.0,
     "phalanx: waiting for nodes: 10 of 2..16 present (a, b, +8 more); enough to start; "
     "waiting for the others to join or the last call to end; join timeout in 1 s"),
    (Waiting(3, 2, (), queued=True), 1, 4, -3.0,
     "phalanx: waiting to join: round 2 is running without this node; waiting for round 3 "
     "to open; join timeout in 0 s"),
    (Waiting(3, 2, (), queued=True, spare=True), 1, 2, -3.0,
     "phalanx: waiting to join: round 2 is running without this node; a spare: it waits for "
     "round 3 as long as the job runs"),
]  # fmt: skip


@pytest.mark.parametrize(("waiting", "low", "high", "left", "text"), TEXTS)
def test_the_text(waiting: Waiting, low: int, high: int, left: float, text: str) -> None:
    assert waiting_text(waiting, low, high, left) == text


def c10d(port: int) -> list[str]:
    return [
        "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "wait", "--rdzv-conf", FAST,
    ]  # fmt: skip


def static(port: int, node_rank: int) -> list[str]:
    return [
        "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "static",
        "--node-rank", str(node_rank), "--master-addr", "127.0.0.1", "--master-port", str(port),
        "--rdzv-conf", FAST,
    ]  # fmt: skip


@pytest.mark.parametrize("backend", ["c10d", "static"])
def test_a_log_gets_plain_lines_while_the_first_node_waits(
    backend: str, nodes: list[Node], tmp_path: Path
) -> None:
    """stderr a file: the line ``1 of 2 present (this host)``, whole lines (no ``\\r``),
    then the round forms once the second node comes."""
    net, port = Loopback(), free_port()
    args = (lambda i: c10d(port)) if backend == "c10d" else (lambda i: static(port, i))
    nodes.append(Node(net, 0, [*args(0), *JOB], tmp_path, "first"))
    first = nodes[0]
    line = f"phalanx: waiting for nodes: 1 of 2 present ({socket.gethostname()}); 1 more needed"
    wait_for(lambda: line in first.stderr, HANG, "the first node's waiting line")
    nodes.append(Node(net, 1, [*args(1), *JOB], tmp_path, "second"))
    assert [n.finish(HANG) for n in nodes] == [0, 0], first.stderr + nodes[1].stderr
    err = first.stderr
    assert "\r" not in err
    waiting = [i for i, text in enumerate(err.splitlines()) if line in text]
    formed = next(i for i, text in enumerate(err.splitlines()) if "round 0: node" in text)
    assert waiting and max(waiting) < formed, err
    assert "join timeout in " in err.splitlines()[waiting[0]]
    # It names where it waits, so a node waiting at the wrong place shows it.
    assert err.splitlines()[waiting[0]].endswith(
        f"; rendezvous: the {backend} store at 127.0.0.1:{port}"
    ), err
    assert "waiting for nodes" not in nodes[1].stderr  # it came last: the round formed at once


def test_a_spare_waits_past_join_timeout_and_leaves_with_0_when_the_job_ends(
    nodes: list[Node], tmp_path: Path
) -> None:
    """A node that comes while the job runs at MAX (2) is a spare: it says so, waits past
    ``join_timeout`` (3 s here) as long as the job runs, and when the job finishes without
    it leaves with exit 0 and one line."""
    net, port, gate = Loopback(), free_port(), tmp_path / "gate"
    gate.mkdir()
    short = FAST.replace("join_timeout=60", "join_timeout=3")
    hold = [*c10d(port)[:-1], short, worker("hold_until_go.py"), str(gate)]
    for name in ("a", "b"):
        nodes.append(Node(net, 0, hold, tmp_path, name))
    wait_for(lambda: {p.name for p in gate.iterdir()} == {"ready0", "ready1"}, HANG, "the job")
    nodes.append(Node(net, 2, hold, tmp_path, "spare"))
    spare = nodes[2]
    line = "phalanx: waiting to join: round 0 is running without this node; a spare: it waits"
    wait_for(lambda: line in spare.stderr, HANG, "the spare's waiting line")
    time.sleep(6)  # twice join_timeout: a spare is not timed out while the job runs
    assert spare.proc.poll() is None, spare.stderr
    # ``phalanx status`` on a member counts it (the heartbeat thread reads the queue).
    run_dir = next(nodes[0].logs.iterdir())
    wait_for(lambda: json.loads((run_dir / "status.json").read_text())["spares"] == 1, HANG,
             "status.json: 1 spare")  # fmt: skip
    shown = run_phalanx(["status", str(run_dir)], timeout=60)
    assert "1 spare waiting (agents beyond --nnodes MAX" in shown.stdout, shown.stdout
    (gate / "go").touch()
    assert [n.finish(HANG) for n in nodes[:2]] == [0, 0], nodes[0].stderr
    assert spare.finish(HANG) == 0, spare.stderr  # not needed: said, not run, not a failure
    assert "the job finished while this node waited as a spare" in spare.stderr, spare.stderr
    assert "no place for this node" not in spare.stderr


class PtyReader:
    """Everything written to a pseudo-terminal's slave side, read off its master."""

    def __init__(self) -> None:
        self.master, self.slave = pty.openpty()
        self.data = b""
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._done.is_set():
            ready, _, _ = select.select([self.master], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:  # the slave closed (EIO)
                    return
                self.data += chunk

    def text(self) -> str:
        return self.data.decode(errors="replace")

    def close(self) -> None:
        self._done.set()
        self._thread.join(5)
        os.close(self.master)


@pytest.fixture
def etcd() -> Iterator[EtcdCluster]:
    with EtcdCluster(size=1) as cluster:
        yield cluster


@pytest.mark.slow
@needs_etcd
def test_a_terminal_gets_one_line_redrawn_in_place(
    etcd: EtcdCluster, nodes: list[Node], tmp_path: Path
) -> None:
    """stderr a terminal (the etcd backend): the line is drawn after ``\\r`` and a clear to
    the end of the line, and ended with a newline when the round forms."""
    endpoint = etcd.endpoints[0].removeprefix("http://")
    args = [
        sys.executable, "-m", "phalanx", "--nnodes", "2", "--nproc-per-node", "1",
        "--rdzv-backend", "etcd", "--rdzv-endpoint", endpoint, "--rdzv-id", "wait-tty",
        "--rdzv-conf", FAST,
    ]  # fmt: skip
    terminal = PtyReader()
    try:
        first = subprocess.Popen(
            [*args, "--log-dir", str(tmp_path / "a"), *JOB],
            stdout=subprocess.DEVNULL, stderr=terminal.slave, start_new_session=True,
        )  # fmt: skip
        try:
            drawn = "\r\x1b[Kphalanx: waiting for nodes: 1 of 2 present"
            wait_for(lambda: drawn in terminal.text(), HANG, "the line drawn in place")
            nodes.append(Node(Loopback(), 1, [*args[3:], *JOB], tmp_path, "second"))
            assert first.wait(HANG) == 0, terminal.text()
            assert nodes[0].finish(HANG) == 0, nodes[0].stderr
        finally:
            if first.poll() is None:
                os.killpg(first.pid, 9)
                first.wait(10)
        os.close(terminal.slave)
    finally:
        terminal.close()
    out = terminal.text()
    last = out.rindex("\r\x1b[K")
    ended = out[last:].split("\n", 1)  # the last drawing is ended by a newline ...
    assert len(ended) == 2 and "waiting for nodes" in ended[0], out
    assert "phalanx: " in ended[1] and "round 0: node" in out[last:], out  # ... before the rest
    # This host named: alone, or with the second node if it arrived before the round formed
    # (its count can be read before its host name is: then it is "+1 more").
    host = socket.gethostname()
    named = (f"({host})", f"({host}, {host})", f"({host}, +1 more)")
    assert any(n in ended[0] for n in named), ended[0]


class Screen:
    """An ``io`` stand-in that is, or is not, a terminal (what the line writes is the test)."""

    def __init__(self, tty: bool) -> None:
        self.tty, self.text = tty, ""

    def isatty(self) -> bool:
        return self.tty

    def write(self, text: str) -> int:
        self.text += text
        return len(text)

    def flush(self) -> None:
        pass


def _line(tty: bool) -> tuple[WaitingLine, Screen, list[float], Board]:
    board = Board(MemoryStore(MemoryServer()), Keys("job"), "me")
    screen, now = Screen(tty), [100.0]
    line = WaitingLine(board, 2, 3, out=lambda: screen, clock=lambda: now[0])  # type: ignore[arg-type, return-value]
    return line, screen, now, board


def _arrive(board: Board, host: str) -> None:
    slot = board.store.add(board.keys.round(0, "joined"), 1)
    board.store.set(board.keys.node(0, slot), encode({"hostname": host}))


@pytest.mark.parametrize("tty", [False, True])
def test_when_the_line_is_said(tty: bool) -> None:
    """The rules on an injected clock: quiet for the first second; at once on a change; the
    same line again after 5 s on a terminal, after 30 s in a log; a newline ends a drawn line."""
    line, screen, now, board = _line(tty)
    _arrive(board, "hostA")
    deadline = now[0] + 60
    line.check(0, deadline)
    now[0] += 0.5
    line.check(0, deadline)
    assert screen.text == ""  # quiet: the round may form at once
    now[0] += 0.6
    line.check(0, deadline)
    said = screen.text.count("1 of 2..3 present (hostA)")
    assert said == 1
    now[0] += 4
    line.check(0, deadline)  # nothing changed, too soon on either
    assert screen.text.count("present") == 1
    now[0] += 1.1
    line.check(0, deadline)  # 5 s: a terminal's countdown is redrawn; a log waits
    assert screen.text.count("present") == (2 if tty else 1)
    _arrive(board, "hostB")
    line.check(0, deadline)  # a change: at once on both
    assert "2 of 2..3 present (hostA, hostB)" in screen.text
    now[0] += 30
    line.check(0, deadline)
    assert screen.text.count("2 of 2..3") == 2  # 30 s: a log says it again too
    line.end()
    if tty:
        assert screen.text.startswith("\r\x1b[K") and screen.text.endswith("\n")
        assert screen.text.count("\n") == 1  # one line, redrawn in place
    else:
        assert "\r" not in screen.text and screen.text.count("\n") == 3


def test_an_arrival_not_yet_announced_is_named_later() -> None:
    line, screen, now, board = _line(False)
    _arrive(board, "hostA")
    board.store.add(board.keys.round(0, "joined"), 1)  # slot 2 counted, not yet written
    line.check(0, now[0] + 10)  # the wait begins (quiet)
    now[0] += 2
    line.check(0, now[0] + 10)
    assert "2 of 2..3 present (hostA, +1 more)" in screen.text
    board.store.set(board.keys.node(0, 2), encode({"hostname": "hostB"}))
    line.check(0, now[0] + 10)
    assert "2 of 2..3 present (hostA, hostB)" in screen.text


class CountingStore(MemoryStore):
    def __init__(self, server: MemoryServer) -> None:
        super().__init__(server)
        self.gets = 0

    def get(self, key: str) -> bytes | None:
        self.gets += 1
        return super().get(key)


def test_a_check_reads_the_count_and_each_of_the_first_8_names_once() -> None:
    store = CountingStore(MemoryServer())
    board = Board(store, Keys("job"), "me")
    for i in range(10):
        _arrive(board, f"h{i}")
    screen, now = Screen(False), [0.0]
    line = WaitingLine(board, 12, 12, out=lambda: screen, clock=lambda: now[0])  # type: ignore[arg-type, return-value]
    line.check(0, 60.0)
    now[0] = 2.0
    store.gets = 0
    line.check(0, 60.0)
    assert "10 of 12 present (h0, h1, h2, h3, h4, h5, h6, h7, +2 more)" in screen.text
    assert store.gets == 1 + 8
    store.gets = 0
    now[0] = 40.0
    line.check(0, 60.0)
    assert store.gets == 1 and screen.text.count("10 of 12") == 2


def test_a_re_forming_round_says_it_waits_for_the_last_rounds_members(
    nodes: list[Node], tmp_path: Path
) -> None:
    """Two real c10d agents run round 0 (``--nnodes 1:3``); node 1's agent freezes (SIGSTOP:
    nobody says it is gone, whereas a SIGKILLed agent's guardian would, at once) and a
    third node arrives: node 0 re-forms for it at once and waits for round 0's members to
    settle -- node 1 neither rejoins nor is found lost until its heartbeats are
    heartbeat_timeout old -- and the line says that, not "waiting for the others to join or
    the last call to end" (``last_call_timeout`` is 1 s)."""
    shared, port = tmp_path / "shared", free_port()
    shared.mkdir()

    def agent(i: int) -> Node:
        args = ["--nnodes", "1:3", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "settling",
                "--rdzv-conf", f"is_host={'true' if i == 0 else 'false'},last_call_timeout=1",
                worker("hold_until_go.py"), str(shared)]  # fmt: skip
        return Node(Loopback(), i, args, tmp_path, f"n{i}")

    nodes += [agent(0), agent(1)]
    wait_for(lambda: len(list(shared.glob("ready*"))) == 2, HANG, "round 0's two workers")
    os.kill(nodes[1].proc.pid, signal.SIGSTOP)  # (the nodes fixture SIGKILLs it after)
    nodes.append(agent(2))
    said: list[str] = []

    def line_said() -> bool:
        assert nodes[0].proc.poll() is None, nodes[0].stderr
        said[:] = [line for line in nodes[0].stderr.splitlines() if "waiting for nodes" in line]
        return bool(said)

    try:
        wait_for(line_said, HANG, "node 0's waiting line")
    finally:
        (shared / "go").touch()
    assert "waiting for round 0's members to rejoin or be found lost (1 of 2 settled" in said[0]
    assert not any("the last call to end" in line for line in said), said
    assert nodes[0].finish(HANG) == 0, nodes[0].stderr
