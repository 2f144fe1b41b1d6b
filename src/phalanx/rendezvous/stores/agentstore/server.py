"""The agent store's server: one thread, one ``selectors`` loop, every connection authenticated.

The hosting agent runs it (c10d: the agent on the endpoint's machine; static: node 0). One
thread serves every connection, so a thousand connected agents cost a thousand sockets and
no threads; the data is a dict only that thread touches. A connection's requests are served
in order; a ``wait`` parks its connection (the client opens another for its other threads)
until the keys exist or its time is up, and is woken by the writes of the keys it waits for.

Until a peer has proved the token (``auth``) the server reads nothing but the handshake,
in frames of a few hundred bytes, and drops a peer that has not finished it within
``handshake_timeout``. A peer that fails it gets one line saying why and is closed; the
server logs one line per peer address (later refusals from the same address are counted,
not logged, so an intruder cannot flood the log). Connections that close without sending a
byte (the other agents' reachability probes) are not refusals.

It binds only the address it is given: ``127.0.0.1`` stays on loopback, a name binds the
address it resolves to, and ``0.0.0.0`` (or ``::``) means every interface. One exception
(``bind_address``): a host name other than ``localhost`` that resolves here to loopback only
(Debian's ``127.0.1.1 myhost`` in ``/etc/hosts``) names this machine to the other nodes,
which resolve it to its real address; binding loopback would lock them out, so every
interface is bound then, and a line says so.
"""

from __future__ import annotations

import contextlib
import heapq
import ipaddress
import itertools
import logging
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field

from phalanx.rendezvous.stores.agentstore import auth, wire
from phalanx.rendezvous.stores.agentstore.auth import Token

log = logging.getLogger("phalanx")

HANDSHAKE_TIMEOUT = 10.0
_BACKLOG = 4096  # the kernel caps it at net.core.somaxconn
_READ_CHUNK = 65536
_REFUSED = (
    b"this node does not know the job's rendezvous token (set the same PHALANX_RDZV_TOKEN "
    b"or --rdzv-conf token_file=PATH on every node)"
)


@dataclass(eq=False)
class _Peer:
    sock: socket.socket
    name: str
    nonce: bytes
    deadline: float  # for the handshake; float("inf") once authenticated
    authenticated: bool = False
    inbox: bytearray = field(default_factory=bytearray)
    outbox: bytearray = field(default_factory=bytearray)
    waiting: tuple[list[bytes], float] | None = None  # (keys, deadline) of a parked wait
    closing: bool = False  # close once the outbox is sent
    heard: bool = False  # sent at least one byte


class StoreServer:
    """A running agent store. ``start`` binds and serves; ``close`` stops it."""

    def __init__(self, listener: socket.socket, token: Token, *, handshake_timeout: float) -> None:
        """Serve on a bound, listening socket (use ``start``); no thread runs until ``serve``."""
        self._listener = listener
        self._key = token.key
        self._handshake_timeout = handshake_timeout
        self._data: dict[bytes, bytes] = {}
        self._peers: dict[socket.socket, _Peer] = {}
        self._waiters: dict[bytes, set[_Peer]] = {}  # key -> peers whose wait names it
        self._deadlines: list[tuple[float, int, _Peer]] = []  # a heap; stale entries skipped
        self._order = itertools.count()
        self._refused: dict[str, int] = {}  # peer host -> refusals
        self._selector = selectors.DefaultSelector()
        self._wake_read, self._wake_write = socket.socketpair()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="phalanx-agent-store", daemon=True)

    @classmethod
    def start(
        cls, host: str, port: int, token: Token, *, handshake_timeout: float = HANDSHAKE_TIMEOUT
    ) -> StoreServer:
        """Bind ``host:port`` (0: a free port) and serve from a thread of its own.
        Raises ``OSError`` when the address cannot be bound (the port is taken)."""
        listener = bind(bind_address(host), port)
        server = cls(listener, token, handshake_timeout=handshake_timeout)
        server.serve()
        return server

    @property
    def host(self) -> str:
        return str(self._listener.getsockname()[0])

    @property
    def port(self) -> int:
        return int(self._listener.getsockname()[1])

    @property
    def key_count(self) -> int:
        """How many keys the store holds now (a glance from another thread)."""
        return len(self._data)

    def serve(self) -> None:
        self._listener.setblocking(False)
        self._wake_read.setblocking(False)
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._selector.register(self._wake_read, selectors.EVENT_READ)
        self._thread.start()

    def close(self) -> None:
        """Stop serving and close every connection (idempotent)."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        with contextlib.suppress(OSError):
            self._wake_write.send(b"x")
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(10)
        for peer in list(self._peers.values()):
            self._drop(peer)
        for sock in (self._listener, self._wake_read, self._wake_write):
            sock.close()
        self._selector.close()

    # The loop, in the server's thread.

    def _loop(self) -> None:
        while not self._stopping.is_set():
            events = self._selector.select(self._next_timeout())
            for key, mask in events:
                if key.fileobj is self._listener:
                    self._accept()
                elif key.fileobj is self._wake_read:
                    self._wake_read.recv(64)
                else:
                    peer = self._peers.get(key.fileobj)  # type: ignore[call-overload]
                    if peer is not None and mask & selectors.EVENT_READ:
                        self._read(peer)
                    if (
                        peer is not None
                        and peer.sock in self._peers
                        and mask & selectors.EVENT_WRITE
                    ):
                        self._flush(peer)
            self._expire()

    def _next_timeout(self) -> float:
        if not self._deadlines:
            return 1.0
        return max(0.0, min(1.0, self._deadlines[0][0] - time.monotonic()))

    def _accept(self) -> None:
        while True:
            try:
                sock, address = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors: the others are still served
                log.warning("rendezvous store: cannot accept a connection: %s", exc)
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            peer = _Peer(sock, _peer_name(address), auth.new_nonce(),
                         time.monotonic() + self._handshake_timeout)  # fmt: skip
            self._peers[sock] = peer
            self._selector.register(sock, selectors.EVENT_READ)
            self._schedule(peer.deadline, peer)
            self._send(peer, [auth.GREETING, peer.nonce])

    def _read(self, peer: _Peer) -> None:
        try:
            chunk = peer.sock.recv(_READ_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._drop(peer)
            return
        peer.heard = True
        if peer.closing:
            return  # refused: nothing it says is read
        peer.inbox += chunk
        self._serve_inbox(peer)

    def _serve_inbox(self, peer: _Peer) -> None:
        while peer.waiting is None and not peer.closing and peer.sock in self._peers:
            limit = wire.MAX_FRAME if peer.authenticated else wire.MAX_HANDSHAKE_FRAME
            try:
                if len(peer.inbox) < wire.HEADER:
                    return
                length = wire.frame_length(bytes(peer.inbox[: wire.HEADER]), limit)
                if len(peer.inbox) < wire.HEADER + length:
                    return
                payload = bytes(peer.inbox[wire.HEADER : wire.HEADER + length])
                del peer.inbox[: wire.HEADER + length]
                fields = wire.decode(payload)
            except wire.FrameError as exc:
                if peer.authenticated:
                    self._refuse(peer, f"sent junk ({exc})", quietly=True)
                else:
                    self._refuse(peer, f"sent something that is not the handshake ({exc})")
                return
            if peer.authenticated:
                self._request(peer, fields)
            else:
                self._handshake(peer, fields)

    def _handshake(self, peer: _Peer, fields: list[bytes]) -> None:
        if len(fields) != 2 or len(fields[1]) != auth.NONCE_BYTES:
            self._refuse(peer, "sent something that is not the handshake")
            return
        proof, client_nonce = fields
        if not auth.proves(auth.client_proof(self._key, peer.nonce, client_nonce), proof):
            self._refuse(peer, "did not prove this job's rendezvous token")
            return
        peer.authenticated = True
        peer.deadline = float("inf")
        self._send(peer, [wire.OK, auth.server_proof(self._key, peer.nonce, client_nonce)])

    def _refuse(self, peer: _Peer, why: str, *, quietly: bool = False) -> None:
        host = peer.name.rsplit(":", 1)[0]
        self._refused[host] = self._refused.get(host, 0) + 1
        if not quietly and self._refused[host] == 1:
            log.warning(
                "rendezvous store: refused %s: it %s (later refusals of %s are not logged)",
                peer.name, why, host,
            )  # fmt: skip
        self._send(peer, [wire.ERROR, _REFUSED])
        peer.closing = True
        peer.inbox.clear()
        if not peer.outbox:
            self._drop(peer)

    def _request(self, peer: _Peer, fields: list[bytes]) -> None:
        try:
            reply = self._answer(peer, fields)
        except (wire.FrameError, IndexError, ValueError) as exc:
            reply = [wire.ERROR, f"a malformed request: {exc or 'missing fields'}".encode()]
        if reply is not None:
            self._send(peer, reply)

    def _answer(self, peer: _Peer, fields: list[bytes]) -> list[bytes] | None:
        op = fields[0]
        data = self._data
        if op == wire.GET:
            value = data.get(fields[1])
            return [wire.OK, wire.ABSENT] if value is None else [wire.OK, wire.PRESENT, value]
        if op == wire.SET:
            self._write(fields[1], fields[2])
            return [wire.OK]
        if op == wire.ADD:
            key, amount = fields[1], wire.decode_int(fields[2])
            old = data.get(key)
            if old is not None and not _is_int(old):
                return [wire.ERROR, b"not an integer"]
            total = (0 if old is None else int(old)) + amount
            self._write(key, wire.encode_int(total))
            return [wire.OK, wire.encode_int(total)]
        if op == wire.COMPARE_SET:
            key, marker, expected, desired = fields[1:5]
            current = data.get(key)
            if (current is None) if marker == wire.ABSENT else (current == expected):
                self._write(key, desired)
                return [wire.OK, wire.TRUE, wire.PRESENT, desired]
            if current is None:
                return [wire.OK, wire.FALSE, wire.ABSENT]
            return [wire.OK, wire.FALSE, wire.PRESENT, current]
        if op == wire.DELETE:
            existed = data.pop(fields[1], None) is not None
            return [wire.OK, wire.TRUE if existed else wire.FALSE]
        if op == wire.WAIT:
            timeout, keys = wire.decode_int(fields[1]) / 1000, fields[2:]
            if all(key in data for key in keys):
                return [wire.OK, wire.TRUE]
            deadline = time.monotonic() + max(0.0, timeout)
            peer.waiting = (keys, deadline)
            for key in keys:
                self._waiters.setdefault(key, set()).add(peer)
            self._schedule(deadline, peer)
            return None
        if op == wire.PING:
            return [wire.OK]
        raise ValueError(f"unknown operation {op[:20]!r}")

    def _write(self, key: bytes, value: bytes) -> None:
        self._data[key] = value
        for peer in list(self._waiters.get(key, ())):
            assert peer.waiting is not None
            if all(k in self._data for k in peer.waiting[0]):
                self._end_wait(peer, found=True)

    def _end_wait(self, peer: _Peer, *, found: bool) -> None:
        assert peer.waiting is not None
        for key in peer.waiting[0]:
            waiting = self._waiters.get(key)
            if waiting is not None:
                waiting.discard(peer)
                if not waiting:
                    del self._waiters[key]
        peer.waiting = None
        self._send(peer, [wire.OK, wire.TRUE if found else wire.FALSE])
        self._serve_inbox(peer)

    def _schedule(self, deadline: float, peer: _Peer) -> None:
        heapq.heappush(self._deadlines, (deadline, next(self._order), peer))

    def _expire(self) -> None:
        now = time.monotonic()
        while self._deadlines and self._deadlines[0][0] <= now:
            deadline, _, peer = heapq.heappop(self._deadlines)
            if peer.sock not in self._peers:
                continue
            if not peer.authenticated and peer.deadline == deadline:
                if peer.heard:
                    self._refuse(peer, "did not finish the handshake in time")
                self._drop(peer)
            elif peer.waiting is not None and peer.waiting[1] == deadline:
                self._end_wait(peer, found=False)

    def _send(self, peer: _Peer, fields: list[bytes]) -> None:
        peer.outbox += wire.encode(fields)
        self._flush(peer)

    def _flush(self, peer: _Peer) -> None:
        if peer.sock not in self._peers:
            return
        try:
            sent = peer.sock.send(peer.outbox) if peer.outbox else 0
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._drop(peer)
            return
        del peer.outbox[:sent]
        if not peer.outbox and peer.closing:
            self._drop(peer)
            return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if peer.outbox else 0)
        if self._selector.get_key(peer.sock).events != events:
            self._selector.modify(peer.sock, events)

    def _drop(self, peer: _Peer) -> None:
        if self._peers.pop(peer.sock, None) is None:
            return
        if peer.waiting is not None:
            for key in peer.waiting[0]:
                self._waiters.get(key, set()).discard(peer)
            peer.waiting = None
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._selector.unregister(peer.sock)
        peer.sock.close()


def bind_address(host: str) -> str:
    """The address to bind for an endpoint naming ``host`` (see the module docstring)."""
    try:
        ipaddress.ip_address(host.strip("[]"))
        return host  # an address means that address
    except ValueError:
        pass
    if host in ("", "localhost"):
        return host or "0.0.0.0"
    try:
        found = {
            str(info[4][0]) for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        }
    except socket.gaierror:
        return host  # bind() says why
    if found and all(ipaddress.ip_address(addr.split("%")[0]).is_loopback for addr in found):
        log.info(
            "rendezvous store: %s resolves to loopback only here (%s), which the other "
            "nodes cannot reach; listening on every interface", host, ", ".join(sorted(found)),
        )  # fmt: skip
        return "0.0.0.0"
    return host


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on the address ``host`` resolves to (the first one), ``port``."""
    family, _, _, _, sockaddr = socket.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        # A restarted host must not wait out its old connections' TIME_WAIT. On Linux this
        # still refuses a port another socket listens on, whatever address it bound.
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(sockaddr)
        listener.listen(_BACKLOG)
    except OSError:
        listener.close()
        raise
    return listener


def _peer_name(address: object) -> str:
    if isinstance(address, tuple) and len(address) >= 2:
        host, port = address[0], address[1]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return str(address)


def _is_int(value: bytes) -> bool:
    return value.lstrip(b"-").isdigit()
