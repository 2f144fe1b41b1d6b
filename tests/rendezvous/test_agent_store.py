"""The agent store over real sockets: who it lets in, what an intruder gets, where it listens.

The rightful client and the server share a token; every intruder here is a real peer on the
port -- a raw socket that sends junk, one that sends a well-formed request without the
handshake, torch's ``TCPStore`` client (in a process of its own, bounded) -- and after each
the store's contents are what the rightful client wrote, and it still serves.
"""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from phalanx.rendezvous.api import EventKind, JobEvent, NodeInfo
from phalanx.rendezvous.dynamic.board import Board
from phalanx.rendezvous.dynamic.keys import Keys
from phalanx.rendezvous.dynamic.liveness import Liveness
from phalanx.rendezvous.dynamic.members import Membership
from phalanx.rendezvous.settings import RendezvousSettings
from phalanx.rendezvous.stores.agentstore import (
    AgentKVStore,
    StoreServer,
    Token,
    TokenRefused,
    auth,
    wire,
)
from phalanx.rendezvous.stores.agentstore.conf import token_from_conf
from phalanx.rendezvous.stores.agentstore.line import read_frame
from phalanx.rendezvous.stores.base import MalformedReply, StoreUnavailable
from support.impostor import Impostor
from support.launch import wait_for

TOKEN = Token(b"the job's secret", "the test")
HANG = 30.0


@pytest.fixture
def hosted() -> Iterator[AgentKVStore]:
    store = AgentKVStore.host("127.0.0.1", 0, token=TOKEN, read_timeout=5)
    try:
        store.set("master", b"10.0.0.1:1234")
        yield store
    finally:
        store.close()


def _client(port: int, token: Token = TOKEN) -> AgentKVStore:
    return AgentKVStore.connect("127.0.0.1", port, token=token, connect_timeout=5, read_timeout=5)


def _unchanged(store: AgentKVStore) -> None:
    """The rightful data is as written, and a fresh rightful client is served."""
    other = _client(store.port)
    try:
        assert other.get("master") == b"10.0.0.1:1234"
        assert other.get("stopped") is None and other.get("stack_requests") is None
        assert other.add("served", 1) == 1
    finally:
        other.close()
    store.delete("served")


def _read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (bounded by the socket's timeout)."""
    got = bytearray()
    while chunk := sock.recv(4096):
        got += chunk
    return bytes(got)


@pytest.mark.parametrize(
    "token", [Token(b"another secret", "the test"), Token()], ids=["wrong", "none"]
)
def test_a_client_without_the_token_is_refused_with_one_line_on_both_sides(
    hosted: AgentKVStore, token: Token, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="phalanx"), pytest.raises(TokenRefused) as refused:
        _client(hosted.port, token)
    said = str(refused.value)
    assert "refused this node" in said and "PHALANX_RDZV_TOKEN" in said and "\n" not in said
    assert str(hosted.port) in said
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(lines) == 1 and "did not prove this job's rendezvous token" in lines[0], lines
    assert "secret" not in said + lines[0]  # the token's text appears nowhere
    _unchanged(hosted)


def test_a_server_that_cannot_prove_the_token_is_not_trusted() -> None:
    """A process holding the port with another token (another job's store, an impostor that
    accepts any client) is refused by the client, before it sends any request."""
    impostor = StoreServer.start("127.0.0.1", 0, Token(b"another secret"))
    try:
        with pytest.raises(TokenRefused):
            _client(impostor.port)
    finally:
        impostor.close()


def test_an_impostor_that_answers_the_handshake_itself_gets_no_request(tmp_path: Path) -> None:
    """A raw server greets as the store does and answers the client's proof with "ok" and
    random bytes where the server's HMAC proof belongs. The client checks that proof: it is
    refused in one line before the first request, so the impostor never learns what this
    node would write (the master's address, here)."""
    record = tmp_path / "after-handshake"
    impostor = Impostor(record)
    try:
        with pytest.raises(TokenRefused) as refused:
            store = _client(impostor.port)
            store.set("master", b"10.0.0.1:1234")  # what an agent writes first
    finally:
        impostor.close()
    said = str(refused.value)
    assert "did not prove the job's rendezvous token" in said and "\n" not in said, said
    assert f"127.0.0.1:{impostor.port}" in said
    assert not record.exists(), record.read_bytes()  # not one byte after the handshake


@pytest.mark.parametrize(
    "intrusion",
    [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"\xff\xff\xff\xff" + b"x" * 64,  # a frame far past the handshake's limit
        wire.encode([wire.SET, b"master", b"6.6.6.6:1"]),  # a plausible request, no handshake
        wire.encode([wire.ADD, b"stack_requests", b"1"]),
        wire.encode([b"x" * 32, b"y" * 32]),  # a handshake with a made-up proof
    ],
    ids=["http", "huge frame", "set without auth", "add without auth", "forged proof"],
)
def test_a_raw_intruder_reads_and_writes_nothing(hosted: AgentKVStore, intrusion: bytes) -> None:
    with socket.create_connection(("127.0.0.1", hosted.port), timeout=HANG) as sock:
        sock.sendall(intrusion)
        got = _read_all(sock)  # the server closes on it
    fields = _frames(got)
    assert fields[0][0] == auth.GREETING  # the greeting and a nonce, then the refusal only
    assert fields[1:] == [[wire.ERROR, fields[1][1]]] and b"token" in fields[1][1]
    assert b"10.0.0.1" not in got
    _unchanged(hosted)


def test_an_intruder_that_says_nothing_is_dropped(caplog: pytest.LogCaptureFixture) -> None:
    server = StoreServer.start("127.0.0.1", 0, TOKEN, handshake_timeout=0.5)
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=HANG) as sock:
            assert _frames(_read_all(sock))[0][0] == auth.GREETING  # then closed
    finally:
        server.close()


def test_a_torch_tcpstore_client_cannot_use_the_store(hosted: AgentKVStore) -> None:
    """torch's client (what a torchrun agent or a stray script would use) writes the keys an
    attacker wants; it fails within its own timeout and nothing reaches the store."""
    script = (
        "import sys\nfrom datetime import timedelta\nfrom torch.distributed import TCPStore\n"
        "try:\n"
        f"    s = TCPStore('127.0.0.1', {hosted.port}, is_master=False, timeout=timedelta(seconds=2))\n"
        "    s.set('master', b'6.6.6.6:1'); s.add('stack_requests', 1); s.set('stopped', b'1')\n"
        "except Exception as exc:\n    print('failed:', type(exc).__name__); sys.exit(3)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=HANG)  # fmt: skip
    assert done.returncode == 3, (done.stdout, done.stderr)
    _unchanged(hosted)


def test_a_junk_server_is_a_malformed_reply_naming_it() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]

        def answer_junk() -> None:
            for _ in range(2):  # the reachability probe, then the client
                conn, _ = listener.accept()
                with conn:
                    conn.sendall(b"\x00\x00\x00\x05hello")
                    time.sleep(0.5)

        threading.Thread(target=answer_junk, daemon=True).start()
        with pytest.raises(MalformedReply) as junk:
            _client(port)
    assert f"127.0.0.1:{port}" in str(junk.value) and "handshake" in str(junk.value)


def test_a_silent_server_is_unavailable_within_the_read_timeout() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with pytest.raises(StoreUnavailable, match="did not answer the handshake within 1 s"):
            AgentKVStore.connect("127.0.0.1", port, token=TOKEN, connect_timeout=5, read_timeout=1)


def test_the_store_listens_only_on_the_address_it_was_given(hosted: AgentKVStore) -> None:
    """127.0.0.1 stays 127.0.0.1: the kernel's table shows one listener on it, and another
    local address (127.0.0.2, loopback too) is refused."""
    listening = [addr for addr, state in _tcp_sockets() if state == "0A" and addr[1] == hosted.port]
    assert listening == [("127.0.0.1", hosted.port)]
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.2", hosted.port), timeout=5).close()


def test_two_hundred_clients_connected_and_waiting_are_all_served() -> None:
    """Many connections on one server thread: 200 clients each wait on a key; one write
    wakes them all, and every one then writes a key of its own."""
    host = AgentKVStore.host("127.0.0.1", 0, token=TOKEN, read_timeout=10)
    clients = [
        AgentKVStore.connect(
            "127.0.0.1", host.port, token=TOKEN, connect_timeout=10, read_timeout=10
        )
        for _ in range(200)
    ]
    try:
        results: list[bool] = []

        def wait_then_write(i: int, client: AgentKVStore) -> None:
            results.append(client.wait(["go"], HANG))
            client.set(f"done/{i}", b"1")

        threads = [
            threading.Thread(target=wait_then_write, args=(i, c)) for i, c in enumerate(clients)
        ]
        for thread in threads:
            thread.start()
        host.set("go", b"1")
        for thread in threads:
            thread.join(HANG)
        assert results == [True] * 200
        assert host.wait([f"done/{i}" for i in range(200)], HANG)
    finally:
        for client in clients:
            client.close()
        host.close()


def test_many_keys_are_read_in_one_round_trip_in_order(hosted: AgentKVStore) -> None:
    """``get_many`` sends every request at once and reads the replies in order: a thousand
    keys (a round's arrivals), absent ones as None, values past one receive's size, and the
    connection serves the next call as before."""
    keys = [f"r1/node/{i}" for i in range(1, 1001)]
    for i, key in enumerate(keys):
        if i % 7:
            hosted.set(key, f"arrival {i} ".encode() * (100 if i == 500 else 1))
    other = _client(hosted.port)
    try:
        found = other.get_many([*keys, "master"])
        assert found == [hosted.get(key) for key in keys] + [b"10.0.0.1:1234"]
        assert found[0] is None and found[500] == b"arrival 500 " * 100
        assert other.get_many([]) == [] and other.add("served", 1) == 1
    finally:
        other.close()
    hosted.delete("served")


def _frames(data: bytes) -> list[list[bytes]]:
    buffer = bytearray(data)
    return [wire.decode(payload) for payload in wire.split_frames(buffer, wire.MAX_FRAME)]


def _tcp_sockets() -> list[tuple[tuple[str, int], str]]:
    """(local address, state) of every IPv4 TCP socket in /proc/net/tcp."""
    rows = []
    with open("/proc/net/tcp") as table:
        lines = table.read().splitlines()[1:]
    for line in lines:
        local, state = line.split()[1], line.split()[3]
        hex_ip, hex_port = local.split(":")
        ip = ".".join(str(int(hex_ip[i : i + 2], 16)) for i in (6, 4, 2, 0))
        rows.append(((ip, int(hex_port, 16)), state))
    return rows


def test_the_token_file_wins_over_the_variable(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("from the file\n")
    problems: list[str] = []
    conf = {"token_file": str(tmp_path / "token")}
    token = token_from_conf(conf, {"PHALANX_RDZV_TOKEN": "from the variable"}, problems)
    assert problems == [] and token.secret == b"from the file"
    assert token_from_conf({}, {"PHALANX_RDZV_TOKEN": "v"}, problems).secret == b"v"
    assert "from the file" not in repr(token)


def test_a_frame_past_the_limit_ends_that_connection_only(hosted: AgentKVStore) -> None:
    """The server reads the frame's length and refuses it: the client sees the reset while
    it still sends, or the refusal's reply when every byte fit in the sockets' buffers (a
    slow server thread); either way its next call is served, on a fresh connection."""
    with pytest.raises(StoreUnavailable) as refused:
        hosted.set("big", b"x" * (wire.MAX_FRAME + 1))
    if isinstance(refused.value, MalformedReply):
        said = str(refused.value)
        assert "sent junk (a frame of" in said and "rendezvous token" not in said, said
    _unchanged(hosted)


def _serve_raw(listener: socket.socket, replies: list[list[bytes]]) -> None:
    """The server's side of the protocol with the token, by hand: per reply, a connection
    taken, its handshake, one request read, the reply sent and the connection closed."""
    for reply in replies:
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(HANG)
            nonce = auth.new_nonce()
            conn.sendall(wire.encode([auth.GREETING, nonce]))
            _, client_nonce = wire.decode(read_frame(conn, wire.MAX_HANDSHAKE_FRAME))
            conn.sendall(wire.encode([wire.OK, auth.server_proof(TOKEN.key, nonce, client_nonce)]))
            read_frame(conn, wire.MAX_FRAME)
            conn.sendall(wire.encode(reply))


def test_a_connection_that_got_an_error_reply_is_not_used_again() -> None:
    """A server that refuses a request ends its connection (the case above when the refusal
    is read as a reply): the client's next call goes out on a fresh connection, and is
    served. Deterministic here: the raw server closes right after its error reply."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(HANG)
    refusal = [wire.ERROR, b"refused: this connection sent junk; it is closed"]
    server = threading.Thread(
        target=_serve_raw, args=(listener, [refusal, [wire.OK, wire.TRUE]]), daemon=True
    )
    server.start()
    client = AgentKVStore("127.0.0.1", listener.getsockname()[1], TOKEN, read_timeout=HANG)
    try:
        with pytest.raises(MalformedReply, match="sent junk"):
            client.set("k", b"v")
        assert client.delete("k") is True
    finally:
        client.close()
        server.join(HANG)
        listener.close()
    assert not server.is_alive()


def test_a_name_that_resolves_to_loopback_only_listens_everywhere(tmp_path: Path) -> None:
    """Debian's ``127.0.1.1 myhost``: in a mount namespace of its own, a process sees an
    /etc/hosts that maps a made-up name to loopback; the store it hosts for that name listens
    on every interface (the other nodes reach the name at the machine's real address)."""
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n127.0.1.1 phalanx-test-node\n")
    script = (
        "from phalanx.rendezvous.stores.agentstore import AgentKVStore, NO_TOKEN, StoreServer\n"
        "server = StoreServer.start('phalanx-test-node', 0, NO_TOKEN)\n"
        "c = AgentKVStore.connect('phalanx-test-node', server.port, token=NO_TOKEN,"
        " connect_timeout=5, read_timeout=5)\n"
        "c.set('k', b'v'); print(server.host, c.get('k')); c.close(); server.close()\n"
    )
    done = subprocess.run(
        ["unshare", "--mount", "sh", "-c",
         'mount --bind "$1" /etc/hosts && exec "$2" -c "$3"', "sh", str(hosts), sys.executable, script],
        capture_output=True, text=True, timeout=HANG,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0.0.0.0", "b'v'"]


def test_running_out_of_descriptors_is_said_once_and_the_store_recovers() -> None:
    """A store process limited to 40 descriptors, flooded with 60 connections: it says once
    that it cannot accept (no busy loop, no crash), and once they are gone serves again."""
    script = (
        "import logging, resource, sys, time\nlogging.basicConfig(level=logging.WARNING)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (40, 40))\n"
        "from phalanx.rendezvous.stores.agentstore import StoreServer, Token\n"
        f"s = StoreServer.start('127.0.0.1', 0, Token({TOKEN.secret!r}), handshake_timeout=1)\n"
        "print(s.port, flush=True)\nsys.stdin.read()\n"
    )
    server = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    flood: list[socket.socket] = []
    try:
        assert server.stdout is not None and server.stdin is not None
        port = int(server.stdout.readline())
        for _ in range(60):
            flood.append(socket.create_connection(("127.0.0.1", port), timeout=HANG))
        for sock in flood:
            sock.close()
        client = AgentKVStore.connect("127.0.0.1", port, token=TOKEN, connect_timeout=HANG,
                                      read_timeout=HANG)  # fmt: skip
        assert client.add("n", 1) == 1
        client.close()
        server.stdin.close()
        assert server.wait(HANG) == 0
        said = server.stderr.read().decode() if server.stderr else ""
        assert said.count("cannot accept a connection") == 1, said
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(10)


def test_the_host_leaves_last_its_peers_still_read_while_it_closes() -> None:
    """Closing the hosting handle takes no new connections but serves the connected peers
    until they close theirs: a peer's last reads (the job's stop, the failure records for
    its report) still get answers after the rendezvous let the host go."""
    host = AgentKVStore.host("127.0.0.1", 0, token=TOKEN, read_timeout=5, linger=HANG)
    peer = _client(host.port)
    host.set("stopped", b"a peer failed")
    closing = threading.Thread(target=host.close)
    closing.start()
    try:
        wait_for_refusal(host.port)  # draining: no new connections
        assert peer.get("stopped") == b"a peer failed"  # the connected peer is still served
        assert closing.is_alive()
    finally:
        peer.close()
    closing.join(HANG)
    assert not closing.is_alive()  # the last peer gone, the host is done


def wait_for_refusal(port: int) -> None:
    def refused() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
        except (ConnectionRefusedError, ConnectionResetError):  # reset: in the backlog as it closed
            return True
        return False

    wait_for(refused, HANG, "the draining store to refuse connections", every=0.02)


class _CountedWaits(AgentKVStore):
    """An agent store handle whose twins (the watch and heartbeat threads') count waits."""

    waits: ClassVar[list[float]] = []

    def twin(self, read_timeout: float) -> AgentKVStore:
        twin = _CountedWaits(*self._address, self._token, read_timeout=read_timeout)
        return twin

    def wait(self, keys: list[str], timeout: float) -> bool:
        _CountedWaits.waits.append(timeout)
        return super().wait(keys, timeout)


def test_the_watch_waits_for_the_next_event_a_heartbeat_at_a_time_and_is_woken_by_it(
    hosted: AgentKVStore,
) -> None:
    """While nothing happens the watch thread's wait for the next event is parked on the
    server until its next heartbeat duties: about one wait a heartbeat interval, not four
    (load only makes fewer); a peer's event posted meanwhile still wakes it at once."""
    settings = RendezvousSettings(heartbeat_interval=0.4, heartbeat_timeout=4.0)
    keys = Keys("watch")
    store = _CountedWaits("127.0.0.1", hosted.port, TOKEN, read_timeout=5)
    members = Membership(0, 0, ("a", "b"), (NodeInfo(0, "a", "x", 1), NodeInfo(1, "b", "y", 1)))
    liveness = Liveness(Board(store, keys, "a"), settings)
    liveness.follow(members, 0)
    _CountedWaits.waits.clear()
    liveness.start()
    try:
        start = time.monotonic()
        time.sleep(2.0)
        intervals = (time.monotonic() - start) / settings.heartbeat_interval
        assert 0 < len(_CountedWaits.waits) <= intervals + 2, _CountedWaits.waits
        event = JobEvent(EventKind.PEER_FAILED, 1, "rank 1 failed", {"rank": 1})
        Board(hosted, keys, "b").post_event(0, event, about="b")
        wait_for(lambda: liveness.next_event() is not None, HANG, "the event read")
    finally:
        liveness.stop()
        store.close()
