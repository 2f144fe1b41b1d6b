"""``KVStore`` over the agent store (``server``): the client every agent uses, hosting or not.

A handle keeps a small pool of authenticated connections, one per thread that is inside a
call at the time (the agent's thread and its heartbeat thread: two, usually), so a ``wait``
parked on the server never holds up another thread's calls. A connection that fails is
closed and the call raises ``StoreUnavailable``; the next call opens a fresh one, so a
store that comes back (or a connection reset by a middlebox) costs one failed call. A
connection that got an error reply is closed too: the server ends the connections whose
requests it refuses, and a dead one back in the pool would fail the next, good, call.

Every call is bounded: connecting and each request by ``read_timeout``, a ``wait`` by its
own timeout plus ``read_timeout``. Replies that break the protocol raise ``MalformedReply``
naming the server and the request; a server that refuses this node's token, or that cannot
prove the token itself (another process holds the port), raises ``TokenRefused``: both are
final, asking again would get the same answer.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Mapping, Sequence

from phalanx.rendezvous.stores.agentstore import auth, wire
from phalanx.rendezvous.stores.agentstore.auth import Token
from phalanx.rendezvous.stores.agentstore.conf import HOW_TO_SET
from phalanx.rendezvous.stores.agentstore.greeting import HANDSHAKE, NOT_A_STORE, await_greeting
from phalanx.rendezvous.stores.agentstore.line import Line, read_frame
from phalanx.rendezvous.stores.agentstore.server import StoreServer
from phalanx.rendezvous.stores.base import (
    Malformed,
    MalformedReply,
    MalformedValue,
    StoreTimedOut,
    StoreUnavailable,
)
from phalanx.rendezvous.stores.reach import hostport as _hostport
from phalanx.rendezvous.stores.reach import wait_reachable

log = logging.getLogger("phalanx")

# Seconds a hosting handle's close waits for the other nodes to disconnect: their last reads
# take a moment; a node that hangs or vanished without a reset must not hold the exit long.
LINGER = 5.0


class TokenRefused(Malformed):
    """The handshake failed: one side does not know the other's token."""


class OtherStore(StoreUnavailable):
    """The place serves another store than the handle's (``pin``): as if it were not there."""


class AgentKVStore:
    """A ``KVStore`` on an agent store at ``host:port`` (thread-safe)."""

    def __init__(
        self,
        host: str,
        port: int,
        token: Token,
        *,
        read_timeout: float,
        where: str | None = None,
        server: StoreServer | None = None,
        linger: float = LINGER,
    ) -> None:
        """A handle that connects on first use (``connect`` checks the store first).
        ``server``: the store this handle hosts, stopped by ``close`` once the other nodes
        have closed their connections, or after ``linger`` seconds."""
        self._address = (host, port)
        self._token = token
        self._key = token.key
        self._read_timeout = read_timeout
        self.where = where or f"the rendezvous store at {_hostport(host, port)}"
        self._server = server
        self._linger = linger
        self.hosting = server is not None
        self._idle: list[Line] = []
        self._lock = threading.Lock()
        self._closed = False
        self._pin: tuple[str, bytes] | None = None

    @classmethod
    def connect(
        cls, host: str, port: int, *, token: Token, connect_timeout: float, read_timeout: float
    ) -> AgentKVStore:
        """Connect to a store, waiting until ``connect_timeout`` for it to listen (its host
        may start later), and prove the token both ways once."""
        wait_reachable(host, port, connect_timeout, "the rendezvous store")
        store = cls(host, port, token, read_timeout=read_timeout)
        store._release(store._open(say_waiting=True))
        return store

    @classmethod
    def host(
        cls,
        host: str,
        port: int,
        *,
        token: Token,
        read_timeout: float,
        linger: float = LINGER,
        seed: Mapping[str, bytes] | None = None,
    ) -> AgentKVStore:
        """Serve a store on ``host:port`` (only that address; 0 picks a free port) and return
        the hosting handle. Raises ``OSError`` when the address cannot be bound. ``seed``:
        keys it holds before anyone can connect."""
        server = StoreServer.start(host, port, token, seed=seed)
        where = f"the rendezvous store this node hosts on {_hostport(host, server.port)}"
        # Connect to the address bound: a wildcard bind is reached on loopback.
        local = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(server.host, server.host)
        return cls(
            local, server.port, token, read_timeout=read_timeout, where=where, server=server,
            linger=linger,
        )  # fmt: skip

    @property
    def port(self) -> int:
        return self._address[1]

    def pin(self, key: str, value: bytes) -> None:
        """Use a new connection only once ``key`` reads ``value`` on it, else raise
        ``OtherStore``: one connection talks to one server for life, a new one to whatever
        serves the place now -- after the store's host was lost, maybe a fresh store of an
        agent started again there, with the job's token and run id (``claim.STORE_KEY``)."""
        self._pin = (key, value)

    def twin(self, read_timeout: float) -> AgentKVStore:
        """A handle on the same store with a pool of its own and ``read_timeout`` (the
        heartbeat thread's: a call stuck in TCP's retransmission backoff on a lossy link is
        given up quickly and the next one goes out on a fresh connection). Closing it
        closes its connections only, never the server."""
        twin = AgentKVStore(
            self._address[0], self._address[1], self._token, read_timeout=read_timeout,
            where=self.where,
        )  # fmt: skip
        twin._pin = self._pin
        return twin

    def get(self, key: str) -> bytes | None:
        reply = self._call([wire.GET, _key(key)], f"get {key!r}")
        return self._value(reply, 1, f"get {key!r}")

    def get_many(self, keys: list[str]) -> list[bytes | None]:
        """Every key's value in one round trip: the requests go out together and the server
        answers a connection's requests in order."""
        request = f"get {len(keys)} keys"
        replies = self._exchange(_gets(keys), len(keys), request) if keys else []
        return self._values(keys, replies, request)

    def wait_get(
        self, keys: list[str], timeout: float, reads: list[str]
    ) -> tuple[bool, list[bytes | None]]:
        """``wait``, then ``get_many(reads)``, in one round trip: the server serves the reads,
        sent behind the wait, once the wait is over (it parks the connection until then)."""
        request = f"wait {keys!r}"
        millis = wire.encode_int(max(0, int(timeout * 1000)))
        frames = wire.encode([wire.WAIT, millis, *map(_key, keys)]) + _gets(reads)
        waited, *replies = self._exchange(frames, 1 + len(reads), request, max(0.0, timeout))
        found = self._flag(self._checked(waited, request), request)
        return found, self._values(reads, replies, request)

    def set(self, key: str, value: bytes) -> None:
        if not value:
            raise ValueError(
                f"empty value for {key!r}: the KVStore contract needs non-empty values"
            )
        self._call([wire.SET, _key(key), value], f"set {key!r}")

    def add(self, key: str, amount: int) -> int:
        request = f"add {key!r}"
        reply = self._call([wire.ADD, _key(key), wire.encode_int(amount)], request, key=key)
        return self._int(reply, request)

    def compare_set(
        self, key: str, expected: bytes | None, desired: bytes
    ) -> tuple[bool, bytes | None]:
        if not desired or expected == b"":
            raise ValueError("compare_set needs non-empty values (empty is no value)")
        request = f"compare_set {key!r}"
        marker = wire.ABSENT if expected is None else wire.PRESENT
        reply = self._call([wire.COMPARE_SET, _key(key), marker, expected or b"", desired], request)
        return self._flag(reply, request), self._value(reply, 2, request)

    def delete(self, key: str) -> bool:
        request = f"delete {key!r}"
        return self._flag(self._call([wire.DELETE, _key(key)], request), request)

    def wait(self, keys: list[str], timeout: float) -> bool:
        request = f"wait {keys!r}"
        millis = wire.encode_int(max(0, int(timeout * 1000)))
        reply = self._call([wire.WAIT, millis, *map(_key, keys)], request, extra=max(0.0, timeout))
        return self._flag(reply, request)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for line in idle:
            line.close()
        if self._server is not None:
            # The host leaves last: a peer may still read what it needs for its own exit
            # (the job's stop, the failure records) after the rendezvous let this node go.
            self._server.drain(self._linger)
            self._server.close()

    # Connections.

    def _open(self, *, say_waiting: bool = False) -> Line:
        """A new connection that has passed the handshake (``say_waiting``: a line every
        ``REPORT_EVERY`` seconds while the server stays silent, for the first connection)."""
        try:
            sock = socket.create_connection(self._address, timeout=self._read_timeout)
        except TimeoutError:
            raise StoreTimedOut(
                f"{self.where}: cannot connect (no answer within {self._read_timeout:g} s)"
            ) from None
        except OSError as exc:
            raise StoreUnavailable(f"{self.where}: cannot connect ({_why(exc)})") from None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._handshake(sock, say_waiting)
        except BaseException:
            sock.close()
            raise
        return self._pinned(Line(sock))

    def _pinned(self, line: Line) -> Line:
        """``line``, once it reaches the store this handle is pinned to (``pin``)."""
        if self._pin is None:
            return line
        (key, value), request = self._pin, f"get {self._pin[0]!r}"
        try:
            line.bound(self._read_timeout)
            self._send(line, _gets([key]), request)
            (found,) = self._values([key], self._receive(line, request, wire.MAX_FRAME), request)
        except BaseException:
            line.close()
            raise
        if found == value:
            return line
        line.close()
        raise OtherStore(
            f"{self.where} serves another store than the one this node used (its id "
            "differs: the agent there was started again after the job's store was lost, "
            "and serves a fresh one); none of its keys is taken for the job's"
        )

    def _handshake(self, sock: socket.socket, say_waiting: bool = False) -> None:
        request = HANDSHAKE
        if say_waiting:
            await_greeting(sock, self.where, self._read_timeout)
        (hello,) = self._receive(sock, request, wire.MAX_HANDSHAKE_FRAME)
        if len(hello) != 2 or hello[0] != auth.GREETING or len(hello[1]) != auth.NONCE_BYTES:
            raise MalformedReply(self.where, request, "it is not a phalanx rendezvous store")
        server_nonce, client_nonce = hello[1], auth.new_nonce()
        proof = auth.client_proof(self._key, server_nonce, client_nonce)
        try:
            sock.sendall(wire.encode([proof, client_nonce]))
        except TimeoutError:
            raise StoreTimedOut(f"{self.where} did not take {request} in time") from None
        except OSError as exc:
            raise StoreUnavailable(f"{self.where}: {request}: {_why(exc)}") from None
        (answer,) = self._receive(sock, request, wire.MAX_HANDSHAKE_FRAME)
        if answer[:1] == [wire.ERROR]:
            raise TokenRefused(
                f"{self.where} refused this node: the two do not share the job's rendezvous "
                f"token ({HOW_TO_SET})"
            )
        expected = auth.server_proof(self._key, server_nonce, client_nonce)
        if len(answer) != 2 or answer[0] != wire.OK or not auth.proves(expected, answer[1]):
            raise TokenRefused(
                f"{self.where} did not prove the job's rendezvous token: the process serving "
                f"that port is not this job's store, or its token differs ({HOW_TO_SET})"
            )

    def _take(self) -> Line:
        with self._lock:
            if self._closed:
                raise StoreUnavailable(f"{self.where}: closed")
            if self._idle:
                return self._idle.pop()
        return self._open()

    def _release(self, line: Line) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append(line)
                return
        line.close()

    def _call(
        self, fields: Sequence[bytes], request: str, *, key: str | None = None, extra: float = 0.0
    ) -> list[bytes]:
        (reply,) = self._exchange(wire.encode(fields), 1, request, extra)
        return self._checked(reply, request, key)

    def _exchange(
        self, frames: bytes, count: int, request: str, extra: float = 0.0
    ) -> list[list[bytes]]:
        """Send ``frames`` (``count`` requests) on one connection; their replies, in order."""
        line = self._take()
        try:
            line.bound(self._read_timeout + extra)
            self._send(line, frames, request)
            replies = self._receive(line, request, wire.MAX_FRAME, count)
        except BaseException:
            line.close()
            raise
        if any(reply[:1] == [wire.ERROR] for reply in replies):
            # The server closes a connection after refusing what came on it (a frame past
            # the limit, junk): pooled, it would fail the next call, a good one. Errors are
            # rare, so a line that got one is never reused.
            line.close()
        else:
            self._release(line)
        return replies

    def _checked(self, reply: list[bytes], request: str, key: str | None = None) -> list[bytes]:
        """``reply`` if it is ``OK``; else the error it carries, raised."""
        if reply[:1] == [wire.ERROR]:
            why = reply[1][:200].decode("utf-8", "replace") if len(reply) > 1 else "no reason"
            if key is not None and why == "not an integer":
                raise MalformedValue(key, "not an integer")
            raise MalformedReply(self.where, request, f"the server says: {why}")
        if reply[:1] != [wire.OK]:
            raise MalformedReply(self.where, request, "neither ok nor error")
        return reply

    def _send(self, line: Line, frames: bytes, request: str) -> None:
        try:
            line.send(frames)
        except TimeoutError:
            raise StoreTimedOut(f"{self.where} did not take {request} in time") from None
        except OSError as exc:
            raise StoreUnavailable(f"{self.where}: {request}: {_why(exc)}") from None

    def _receive(
        self, on: Line | socket.socket, request: str, limit: int, count: int = 1
    ) -> list[list[bytes]]:
        """The next ``count`` replies on a connection (a ``Line``; a bare socket, one reply,
        during the handshake)."""
        try:
            if isinstance(on, Line):
                return on.receive(limit, count)
            return [wire.decode(read_frame(on, limit))]
        except wire.FrameError as exc:
            raise MalformedReply(self.where, request, str(exc)) from None
        except TimeoutError:
            hint = NOT_A_STORE if request == HANDSHAKE else ""
            within = on.timeout if isinstance(on, Line) else on.gettimeout()
            raise StoreTimedOut(
                f"{self.where} did not answer {request} within {within:g} s{hint}"
            ) from None
        except OSError as exc:
            raise StoreUnavailable(f"{self.where}: {request}: {_why(exc)}") from None

    # Reading replies.

    def _flag(self, reply: list[bytes], request: str) -> bool:
        if len(reply) < 2 or reply[1] not in (wire.TRUE, wire.FALSE):
            raise MalformedReply(self.where, request, "no yes/no answer")
        return reply[1] == wire.TRUE

    def _value(self, reply: list[bytes], at: int, request: str) -> bytes | None:
        if len(reply) == at + 1 and reply[at] == wire.ABSENT:
            return None
        if len(reply) == at + 2 and reply[at] == wire.PRESENT:
            return reply[at + 1]
        raise MalformedReply(self.where, request, "no value and no absent marker")

    def _values(
        self, keys: list[str], replies: list[list[bytes]], request: str
    ) -> list[bytes | None]:
        return [
            self._value(self._checked(reply, request), 1, f"get {key!r}")
            for key, reply in zip(keys, replies, strict=True)
        ]

    def _int(self, reply: list[bytes], request: str) -> int:
        try:
            return wire.decode_int(reply[1])
        except (IndexError, wire.FrameError) as exc:
            raise MalformedReply(self.where, request, str(exc) or "no number") from None


def _key(key: str) -> bytes:
    return key.encode("utf-8")


def _gets(keys: list[str]) -> bytes:
    return b"".join(wire.encode([wire.GET, _key(key)]) for key in keys)


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc) or exc.__class__.__name__
