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

It listens on the address its endpoint names, and only there (``listen``).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import selectors
import socket
import threading
import time
from collections.abc import Mapping

from phalanx.errors import start_thread
from phalanx.rendezvous.stores.agentstore import auth, wire
from phalanx.rendezvous.stores.agentstore.auth import Token
from phalanx.rendezvous.stores.agentstore.listen import bind, bind_address
from phalanx.rendezvous.stores.agentstore.peer import Peer, peer_name, take_frame
from phalanx.rendezvous.stores.agentstore.table import Park, Table
from phalanx.resources.limits import raise_descriptor_limit

log = logging.getLogger("phalanx")

HANDSHAKE_TIMEOUT = 10.0
_ACCEPT_PAUSE = 0.1  # seconds without accepting after running out of descriptors
_READ_CHUNK = 65536
_REFUSED = (
    b"this node does not know the job's rendezvous token (set the same PHALANX_RDZV_TOKEN "
    b"or --rdzv-conf token_file=PATH on every node)"
)


class StoreServer:
    """A running agent store. ``start`` binds and serves; ``close`` stops it."""

    def __init__(
        self,
        listener: socket.socket,
        token: Token,
        *,
        handshake_timeout: float,
        seed: Mapping[str, bytes] | None = None,
    ) -> None:
        """Serve on a bound, listening socket (use ``start``); no thread runs until ``serve``.
        ``seed``: keys the store holds before its first connection (the run it serves)."""
        self._listener = listener
        self._bound = listener.getsockname()
        self._key = token.key
        self._handshake_timeout = handshake_timeout
        self._table: Table[Peer] = Table()
        self._table.data.update((k.encode(), v) for k, v in (seed or {}).items())
        self._peers: dict[socket.socket, Peer] = {}
        self._deadlines: list[tuple[float, int, Peer]] = []  # a heap; stale entries skipped
        self._order = itertools.count()
        self._refused: dict[str, int] = {}  # peer host -> refusals
        self._selector = selectors.DefaultSelector()
        self._wake_read, self._wake_write = socket.socketpair()
        self._stopping = threading.Event()
        self._accept_failed = False  # said once
        self._accept_paused_until = 0.0  # 0: accepting
        self._members = 0  # open connections that proved the token (only the loop writes it)
        self._draining = False
        self._thread = threading.Thread(target=self._loop, name="phalanx-agent-store", daemon=True)

    @classmethod
    def start(
        cls,
        host: str,
        port: int,
        token: Token,
        *,
        handshake_timeout: float = HANDSHAKE_TIMEOUT,
        seed: Mapping[str, bytes] | None = None,
    ) -> StoreServer:
        """Bind ``host:port`` (0: a free port) and serve from a thread of its own.
        Raises ``OSError`` when the address cannot be bound (the port is taken)."""
        listener = bind(bind_address(host), port)
        raise_descriptor_limit()
        server = cls(listener, token, handshake_timeout=handshake_timeout, seed=seed)
        server.serve()
        return server

    @property
    def host(self) -> str:
        return str(self._bound[0])

    @property
    def port(self) -> int:
        return int(self._bound[1])

    @property
    def key_count(self) -> int:
        """How many keys the store holds now (a glance from another thread)."""
        return len(self._table.data)

    def serve(self) -> None:
        self._listener.setblocking(False)
        self._wake_read.setblocking(False)
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._selector.register(self._wake_read, selectors.EVENT_READ)
        start_thread(self._thread)  # a stop signal now must not cut the thread's start

    def drain(self, timeout: float) -> bool:
        """Take no new connections, and wait (at most ``timeout`` seconds) until every peer
        that proved the token has closed its connection; return whether they all did. The
        peers' last reads after the rendezvous is over (the job's stop, the failure records
        for their report) are still answered."""
        self._draining = True
        self._wake()
        deadline = time.monotonic() + timeout
        while self._members > 0 and self._thread.is_alive():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    def close(self) -> None:
        """Stop serving and close every connection (idempotent)."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        self._wake()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(10)
        for peer in list(self._peers.values()):
            self._drop(peer)
        for sock in (self._listener, self._wake_read, self._wake_write):
            sock.close()
        self._selector.close()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_write.send(b"x")

    # The loop, in the server's thread.

    def _loop(self) -> None:
        while not self._stopping.is_set():
            events = self._selector.select(self._next_timeout())
            for key, mask in events:
                if key.fileobj is self._listener:
                    if not self._accept_paused_until:  # the wake in this batch may have closed it
                        self._accept()
                elif key.fileobj is self._wake_read:
                    self._wake_read.recv(64)
                    if self._draining and self._accept_paused_until != float("inf"):
                        self._stop_accepting()
                else:
                    peer = self._peers.get(key.fileobj)  # type: ignore[call-overload]
                    if peer is not None:
                        self._serve_peer(peer, mask)
            self._expire()
            if self._accept_paused_until and time.monotonic() >= self._accept_paused_until:
                self._accept_paused_until = 0.0
                self._selector.register(self._listener, selectors.EVENT_READ)

    def _serve_peer(self, peer: Peer, mask: int) -> None:
        try:
            if mask & selectors.EVENT_READ:
                self._read(peer)
            if peer.sock in self._peers and mask & selectors.EVENT_WRITE:
                self._flush(peer)
        except Exception as exc:  # a bug must cost one connection, not every node's store
            log.warning("rendezvous store: dropped %s after an internal error: %r", peer.name, exc)
            self._drop(peer)

    def _stop_accepting(self) -> None:
        """For good: connecting now is refused by the kernel, at once."""
        if self._accept_paused_until == 0.0:
            self._selector.unregister(self._listener)
        self._accept_paused_until = float("inf")
        self._listener.close()

    def _next_timeout(self) -> float:
        soonest = min(
            self._deadlines[0][0] if self._deadlines else float("inf"),
            self._accept_paused_until or float("inf"),
        )
        return max(0.0, min(1.0, soonest - time.monotonic()))

    def _accept(self) -> None:
        while True:
            try:
                sock, address = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                # Out of descriptors: the listener stays readable, so stop listening for a
                # moment rather than spin; the connections already open are still served.
                if not self._accept_failed:
                    log.warning("rendezvous store: cannot accept a connection: %s", exc)
                self._accept_failed = True
                self._selector.unregister(self._listener)
                self._accept_paused_until = time.monotonic() + _ACCEPT_PAUSE
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            peer = Peer(sock, peer_name(address), auth.new_nonce(),
                         time.monotonic() + self._handshake_timeout)  # fmt: skip
            self._peers[sock] = peer
            self._selector.register(sock, selectors.EVENT_READ)
            self._schedule(peer.deadline, peer)
            self._send(peer, [auth.GREETING, peer.nonce])

    def _read(self, peer: Peer) -> None:
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

    def _serve_inbox(self, peer: Peer) -> None:
        while peer.waiting is None and not peer.closing and peer.sock in self._peers:
            try:
                fields = take_frame(peer)
                if fields is None:
                    return
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

    def _handshake(self, peer: Peer, fields: list[bytes]) -> None:
        if len(fields) != 2 or len(fields[1]) != auth.NONCE_BYTES:
            self._refuse(peer, "sent something that is not the handshake")
            return
        proof, client_nonce = fields
        if not auth.proves(auth.client_proof(self._key, peer.nonce, client_nonce), proof):
            self._refuse(peer, "did not prove this job's rendezvous token")
            return
        peer.authenticated = True
        self._members += 1
        peer.deadline = float("inf")
        self._send(peer, [wire.OK, auth.server_proof(self._key, peer.nonce, client_nonce)])

    def _refuse(self, peer: Peer, why: str, *, quietly: bool = False) -> None:
        host = peer.name.rsplit(":", 1)[0]
        self._refused[host] = self._refused.get(host, 0) + 1
        if not quietly and self._refused[host] == 1:
            log.warning(
                "rendezvous store: refused %s: it %s (later refusals of %s are not logged)",
                peer.name, why, host,
            )  # fmt: skip
        # A peer that proved the token is told what was wrong, not that it lacks the token.
        said = (
            f"refused: this connection {why}; it is closed".encode()
            if peer.authenticated
            else _REFUSED
        )
        self._send(peer, [wire.ERROR, said])
        peer.closing = True
        peer.inbox.clear()
        if not peer.outbox:
            self._drop(peer)

    def _request(self, peer: Peer, fields: list[bytes]) -> None:
        try:
            reply = self._table.answer(fields, peer)
        except (wire.FrameError, IndexError, ValueError, TypeError) as exc:
            reply = [wire.ERROR, f"a malformed request: {exc or 'missing fields'}".encode()]
        if isinstance(reply, Park):
            peer.waiting = time.monotonic() + reply.seconds
            self._schedule(peer.waiting, peer)
        else:
            self._send(peer, reply)
        for woken in self._table.woken():
            self._end_wait(woken, found=True)

    def _end_wait(self, peer: Peer, *, found: bool) -> None:
        self._table.cancel(peer)
        peer.waiting = None
        self._send(peer, [wire.OK, wire.TRUE if found else wire.FALSE])
        self._serve_inbox(peer)

    def _schedule(self, deadline: float, peer: Peer) -> None:
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
            elif peer.waiting == deadline:
                self._end_wait(peer, found=False)

    def _send(self, peer: Peer, fields: list[bytes]) -> None:
        peer.outbox += wire.encode(fields)
        self._flush(peer)

    def _flush(self, peer: Peer) -> None:
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

    def _drop(self, peer: Peer) -> None:
        if self._peers.pop(peer.sock, None) is None:
            return
        if peer.authenticated:
            self._members -= 1
        self._table.cancel(peer)
        peer.waiting = None
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._selector.unregister(peer.sock)
        peer.sock.close()
