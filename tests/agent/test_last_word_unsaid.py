"""A last word that cannot be said (``phalanx.rendezvous.lastword.say_died``): the guardian of
a SIGKILLed stand-in agent (``tests/workers/guardian_agent.py``) whose word points at an etcd
endpoint that is not there, or at a real etcd behind a proxy that answers junk, says so in
the agent's stderr (the node's log); a try that failed at once is made once more.

Tier (c): a real guardian, a real etcd, real TCP (the proxy forwards bytes or answers one
HTTP reply of its own); nothing is mocked."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from phalanx.rendezvous import lastword
from phalanx.rendezvous.dynamic.board import DIED
from phalanx.rendezvous.dynamic.keys import Keys
from phalanx.rendezvous.stores.etcd.conf import EtcdOptions, run_prefix
from phalanx.resources.ports import free_port
from support.etcd_server import EtcdCluster
from support.launch import worker
from support.tools import needs_etcd

pytestmark = needs_etcd

UNSAID = "guardian: could not tell the rendezvous store that this node's agent died"
# A JSON error whose code is no gRPC code: the etcd client gives up on it at once.
JUNK = b'{"error": {"code": "junk", "message": "not etcd"}}'


class Proxy:
    """A TCP proxy to ``target``: its first ``junk`` connections get one HTTP reply of JSON
    that is not etcd's, the others are forwarded both ways."""

    def __init__(self, target: tuple[str, int], junk: int) -> None:
        self.target, self.junk = target, junk
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return  # closed
            self.accepted += 1
            if self.accepted <= self.junk:
                conn.recv(65536)
                head = (
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(JUNK)}\r\nConnection: close\r\n\r\n"
                )
                conn.sendall(head.encode() + JUNK)
                conn.close()
                continue
            upstream = socket.create_connection(self.target, timeout=10)
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=_pipe, args=(a, b), daemon=True).start()

    def close(self) -> None:
        self.server.close()


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def etcd() -> Iterator[EtcdCluster]:
    with EtcdCluster(size=1) as cluster:
        yield cluster


def _agent_dies(endpoint: str, run_id: str) -> str:
    """Start a stand-in agent whose guardian's word names ``endpoint``, SIGKILL it, and
    return the stderr it shares with its guardian, read to the guardian's exit."""
    reach = lastword.etcd([endpoint], EtcdOptions())
    said = lastword.word(reach, run_id, "node-b")
    proc = subprocess.Popen(
        [sys.executable, worker("guardian_agent.py"), json.dumps(said)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        int(proc.stdout.readline())  # the guardian runs, and has the word
        proc.kill()
        _, err = proc.communicate(timeout=30)  # EOF: the guardian, the last writer, exited
        return err
    finally:
        proc.kill()
        proc.wait(10)


def _died(etcd: EtcdCluster, run_id: str) -> bool:
    key = run_prefix(run_id) + "kv/" + Keys(run_id).heartbeat("node-b")
    return etcd.value(key) == DIED


def test_an_unreachable_store_is_said_in_the_nodes_log(tmp_path: Path) -> None:
    """Nothing listens: the client tries until its 2 s are up, and a second try would not
    end before the guardian's deadline."""
    err = _agent_dies(f"http://127.0.0.1:{free_port()}", "unsaid")
    [line] = [line for line in err.splitlines() if UNSAID in line]
    assert line.startswith("phalanx: ") and "1 try" in line, err
    assert "lease runs out (lease_ttl)" in line


def test_a_store_answering_junk_is_tried_twice_then_said(etcd: EtcdCluster) -> None:
    proxy = Proxy(_addr(etcd), junk=2)
    try:
        err = _agent_dies(f"http://127.0.0.1:{proxy.port}", "junk")
    finally:
        proxy.close()
    [line] = [line for line in err.splitlines() if UNSAID in line]
    assert "MalformedReply" in line and "2 tries" in line, err
    assert proxy.accepted == 2
    assert not _died(etcd, "junk")


def test_a_store_that_answered_junk_once_hears_the_word_on_the_second_try(
    etcd: EtcdCluster,
) -> None:
    proxy = Proxy(_addr(etcd), junk=1)
    try:
        err = _agent_dies(f"http://127.0.0.1:{proxy.port}", "once")
    finally:
        proxy.close()
    assert UNSAID not in err, err
    assert _died(etcd, "once")


def _addr(etcd: EtcdCluster) -> tuple[str, int]:
    host, port = etcd.endpoints[0].removeprefix("http://").rsplit(":", 1)
    return host, int(port)
