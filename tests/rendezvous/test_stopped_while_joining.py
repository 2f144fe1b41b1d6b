"""A node stopped inside ``next_round`` after the restart round closed with it as a member
(seen once in a loaded CI run: ``tests/agent/test_slow_rundir.py`` hung for its whole
pytest timeout) tells that round the job stopped, so the other member stops at once
instead of running its workers beside a peer that will never come.

Before the fix the stopped node told the round before (``JOB_STOPPED`` in round 0, whose
event log nobody reads any more) and wrote ``left`` as its heartbeat, which the other
member's ring watch passes over for good: the other member ran its restarted workers for
ever. SIGKILL at the same point is the control: the node's guardian says it died, and the
other member counts it lost.

Real agents on loopback and a real etcd, one worker per node that does not import torch.
The point is reached without any hook, by pausing agents (SIGSTOP) as the round's keys in
etcd show them get there. b's worker fails at once and b judges the round first (a's
worker ignores SIGTERM, so a's agent stops it only after ``--shutdown-timeout``); b is
paused there, so a joins the restart round alone (slot 1, node rank 0 as before) and is
paused in turn; b, let go, joins, closes the round with both, and waits for a (slot 1) to
publish the membership. That wait, the round closed with b in it, is where b is stopped;
a is let go once b is gone. On c10d (the CI run's backend) a serves the store, so only its
main thread is held (a ptrace stop), its store and heartbeats served on.

With the fix taken out both variants hang (a's bound, 60 s, fails them); with only the
round's telling taken out, a finds b gone by its ``left`` heartbeat 10 s (etcd) or 20 s
(c10d) later (``ring``), which the SIGTERM variants fail too.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from phalanx.rendezvous.dynamic.keys import Keys
from phalanx.rendezvous.stores.agentstore import AgentKVStore
from phalanx.rendezvous.stores.agentstore.auth import NO_TOKEN
from phalanx.rendezvous.stores.etcd.conf import run_prefix
from phalanx.resources.ports import free_port
from support.etcd_server import EtcdCluster
from support.hosts import Loopback, Node
from support.launch import wait_for, worker
from support.tools import needs_etcd

pytestmark = pytest.mark.slow

HANG = 120.0  # bounds that only catch a hang
ENDS_WITHIN = 60.0  # a's end after it is let go: its restarted worker sleeps 300 s
GRACE = 5  # --shutdown-timeout: a's worker ignores SIGTERM, so b judges round 0 this long first
# lease_ttl 60 (fence_after 58 s): the pauses cost neither node its lease nor its fence.
# close_timeout 90: b waits in the closed round for as long as the test needs.
COMMON = "heartbeat_interval=0.5,last_call_timeout=1,join_timeout=90,close_timeout=90"
CONF = f"{COMMON},lease_ttl=60,request_timeout=4,exit_barrier_timeout=30"
# c10d: heartbeat_timeout 20 (fence_after 18 s), for the same reason.
C10D_CONF = f"{COMMON},heartbeat_timeout=20,exit_barrier_timeout=30"


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdCluster]:
    with EtcdCluster(size=1) as cluster:
        yield cluster


def _get(etcd: EtcdCluster, run_id: str, key: str) -> bytes | None:
    """The value of the run's ``key`` in etcd now (None: absent)."""
    full = (run_prefix(run_id) + "kv/" + key).encode()
    with etcd.session() as session:
        reply = session.post(
            f"{etcd.endpoints[0]}/v3/kv/range",
            json={"key": base64.b64encode(full).decode()},
            timeout=10,
        )
    reply.raise_for_status()
    kvs = reply.json().get("kvs", [])
    return base64.b64decode(kvs[0]["value"]) if kvs else None


@needs_etcd
@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_a_node_stopped_in_a_closed_restart_round_does_not_leave_the_other_waiting(
    etcd: EtcdCluster, nodes: list[Node], tmp_path: Path, how: signal.Signals
) -> None:
    run_id = f"joinrace-{how.name.lower()}-{os.getpid()}"
    endpoint = etcd.endpoints[0].removeprefix("http://")
    backend = ["--rdzv-backend", "etcd", "--rdzv-endpoint", endpoint, "--rdzv-conf", CONF]

    def get(key: str) -> bytes | None:
        return _get(etcd, run_id, key)

    _stop_b_in_the_closed_round(nodes, tmp_path, run_id, backend, get, _paused, how)


def test_on_c10d_the_store_host_hears_it_too(nodes: list[Node], tmp_path: Path) -> None:
    """The CI run's case: the other member serves the store. It cannot be paused whole (the
    store would stop with it), so only its main thread is held (``ptrace``), its store and
    heartbeats served on."""
    port = free_port()
    endpoint = f"127.0.0.1:{port}"
    backend = ["--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-conf", C10D_CONF]
    client: list[AgentKVStore] = []

    def get(key: str) -> bytes | None:
        if not client:
            client.append(AgentKVStore.connect(
                "127.0.0.1", port, token=NO_TOKEN, connect_timeout=HANG, read_timeout=3
            ))  # fmt: skip
        return client[0].get(key)

    try:
        _stop_b_in_the_closed_round(
            nodes, tmp_path, "joinrace-c10d", backend, get, _main_thread_held, signal.SIGTERM
        )
    finally:
        for store in client:
            store.close()


def _stop_b_in_the_closed_round(
    nodes: list[Node],
    tmp_path: Path,
    run_id: str,
    backend: list[str],
    get: Callable[[str], bytes | None],
    hold: Callable[[int, Callable[[str], bytes | None]], contextlib.AbstractContextManager[None]],
    how: signal.Signals,
) -> None:
    """The scenario of the module's docstring; ``hold`` pauses a (and lets it go after)."""
    marks = tmp_path / "marks"
    marks.mkdir()
    keys = Keys(run_id)
    args = [
        "--nnodes", "2", "--nproc-per-node", "1", "--max-restarts", "1", *backend,
        "--rdzv-id", run_id, "--shutdown-timeout", str(GRACE), "--cold-start",
        worker("stubborn_then_fail.py"), str(marks), "0",
    ]  # fmt: skip
    nodes.append(Node(Loopback(), 0, args, tmp_path, "a"))
    a = nodes[0]
    # a first: slot 1 and node rank 0 of round 0, so node rank 0 of the restart round too.
    wait_for(lambda: get(keys.node(0, 1)) is not None, HANG, "a's arrival")
    nodes.append(Node(Loopback(), 1, args, tmp_path, "b"))
    b = nodes[1]
    wait_for(lambda: get(keys.round(0, "judged")) is not None, HANG, "b to judge round 0")
    with contextlib.ExitStack() as holding:  # a, let go once b is gone
        with _paused(b.proc.pid, get):
            # (b cannot join round 1 before a judged round 0, GRACE s from now at the earliest.)
            assert get(keys.fate(0, 1)) is None, "b was paused too late"
            wait_for(lambda: get(keys.fate(0, 0)) is not None, HANG, "a to rejoin")
            holding.enter_context(hold(a.proc.pid, get))
        # b joins, closes the round with both, and waits for a (slot 1) to assemble it.
        closed = keys.round(1, "closed")
        wait_for(lambda: get(closed) is not None, HANG, "round 1 to close")
        assert b"n" in (get(closed) or b""), "round 1 failed"
        assert get(keys.round(1, "members")) is None  # b is still joining
        b.proc.send_signal(how)
        code = b.finish(HANG)
    try:
        a_code = a.finish(ENDS_WITHIN)
    except subprocess.TimeoutExpired:
        pytest.fail(f"a did not end after b went ({how.name}):\n{a.stderr[-3000:]}")
    if how is signal.SIGTERM:
        assert code == 128 + signal.SIGTERM, b.stderr
        assert a_code == 128 + signal.SIGTERM, a.stderr  # stopped, as b was
        assert "was stopped by SIGTERM" in a.stderr, a.stderr
        # Told in the round, at once: not found gone by its heartbeat (``ring``) 10 s later.
        assert "its heartbeat says it left" not in a.stderr, a.stderr
    else:
        assert code == -signal.SIGKILL
        assert a_code == 1, a.stderr  # b lost, and no restart left
    assert "Traceback" not in a.stderr + b.stderr


@contextlib.contextmanager
def _paused(pid: int, get: Callable[[str], bytes | None]) -> Iterator[None]:
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


PTRACE_SEIZE, PTRACE_INTERRUPT, PTRACE_DETACH = 0x4206, 0x4207, 17
WALL = 0x40000000  # waitpid's __WALL: a thread of another process, traced


@contextlib.contextmanager
def _main_thread_held(pid: int, get: Callable[[str], bytes | None]) -> Iterator[None]:
    """Stop only ``pid``'s main thread (a ptrace stop): its other threads run on. Caught in
    Python code it would hold the GIL and stop them all, so it is let go and caught again
    until the store it serves still answers."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    deadline = time.monotonic() + HANG
    while True:
        if libc.ptrace(PTRACE_SEIZE, pid, None, None) != 0:
            raise OSError(ctypes.get_errno(), "PTRACE_SEIZE")
        libc.ptrace(PTRACE_INTERRUPT, pid, None, None)
        os.waitpid(pid, WALL)
        try:
            get("probe")
            break
        except Exception:
            libc.ptrace(PTRACE_DETACH, pid, None, None)
            assert time.monotonic() < deadline, "could not hold a's main thread outside Python"
    try:
        yield
    finally:
        libc.ptrace(PTRACE_DETACH, pid, None, None)
