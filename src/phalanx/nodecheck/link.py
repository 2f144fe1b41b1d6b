"""The network part of the node check: a bounded test of one link, over TCP, between the
addresses the nodes advertise (the ones their workers are reached at).

Each node listens on an ephemeral port of its address (``Listener``) and tests one link,
to the next node of the round in a ring (``test_link``): ``PINGS`` round trips of 64 bytes
(the mean is the latency: a lost packet's retransmission shows in it), then ``PAYLOAD``
bytes each way (both directions, so a rate limit on either node's sending side shows),
``TRANSFERS`` times: the best counts, so one scheduling hiccup on a busy host (a transfer
takes milliseconds) does not make a healthy link look slow.
Everything is bounded by ``LINK_DEADLINE``; what was not done by then counts as not done
(a link that moved a quarter of the payload in the time has a quarter of the throughput).
A connection must first send the round's random token, so a stray client is dropped.

A link that could not connect by the deadline says which end refused it (``refused_by``):
``PEER``, the listening end did not take it (no answer, a reset, unreachable: a firewall
that drops its inbound connections), or ``SELF``, this node's own kernel would not send
it (no route to the peer, a blackhole route, a local policy hook). A firewall rule on this
node's own output looks like the peer's refusal from here (a dropped SYN gets no answer, a
rejected one a "refused"): it is put on the peer. The workers connect to each other as this test does, so such
a link would hang or fail their process group's start. Connecting is tried afresh every
``CONNECT_TRY`` seconds rather than left to TCP's SYN backoff (1 s, then 2 s): a lossy
link that loses a SYN or two still connects within the deadline, one that never answers
does not.
"""

from __future__ import annotations

import contextlib
import errno
import socket
import struct
import threading
import time
from dataclasses import dataclass

PINGS = 10
PAYLOAD = 4 << 20  # bytes each way
TRANSFERS = 3
LINK_DEADLINE = 3.0  # seconds for one link, connect included
CONNECT_TRY = 0.5  # seconds one connection attempt may wait for its answer
PEER, SELF = "peer", "self"  # which end refused a link that could not connect
# Errors this node's own kernel gives before anything is sent: no route (ENETUNREACH;
# EINVAL for a blackhole route), no such local address, a local policy (a cgroup or LSM
# hook: EPERM, EACCES). iptables on the output gives a timeout or ECONNREFUSED instead.
_OWN_ERRORS = frozenset({errno.EPERM, errno.EACCES, errno.ENETUNREACH, errno.EINVAL, errno.EADDRNOTAVAIL})  # fmt: skip
_CHUNK = 64 * 1024
_MSG = 64
_TOKEN = 16


@dataclass(frozen=True)
class LinkResult:
    """One link's figures: mean round trip in ms (None: no round trip completed),
    throughput in MB/s (bytes moved both ways / seconds), what went wrong ("" none), and
    for a link that could not connect, the end that refused it (``PEER``, ``SELF``)."""

    latency_ms: float | None
    throughput: float
    error: str = ""
    refused_by: str = ""

    def to_json(self) -> dict[str, object]:
        return {
            "latency_ms": self.latency_ms, "throughput": self.throughput, "error": self.error,
            "refused_by": self.refused_by,
        }  # fmt: skip


class Listener:
    """The server side: answers pings and payloads of clients that send ``token``, from a
    thread per connection, until ``close``."""

    def __init__(self, addr: str, token: bytes) -> None:
        self.token = token
        self._sock = _listen(addr)
        self.port = int(self._sock.getsockname()[1])
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="phalanx-check", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop listening; the accepting thread ends (bounded wait). Closing the socket alone
        would not wake it: on Linux a thread blocked in accept() stays there after another
        thread closes the socket, so every round's check left a thread and its socket behind
        (the soak's store host: 11 -> 26 threads). ``shutdown`` wakes it."""
        self._closed.set()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._sock.close()
        self._thread.join(timeout=LINK_DEADLINE)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(LINK_DEADLINE + 1)
            try:
                if _read(conn, _TOKEN) != self.token:
                    return
                while not self._closed.is_set():
                    command = _read(conn, 1)
                    if command == b"p":
                        conn.sendall(command + _read(conn, _MSG - 1))
                    elif command == b"t":
                        (size,) = struct.unpack("!I", _read(conn, 4))
                        _drain(conn, min(size, PAYLOAD))
                        _send(conn, min(size, PAYLOAD))
                    else:
                        return
            except (OSError, EOFError):
                return


def test_link(addr: str, port: int, token: bytes) -> LinkResult:
    """Test the link to ``addr:port`` within ``LINK_DEADLINE``."""
    deadline = time.monotonic() + LINK_DEADLINE
    trips: list[float] = []
    rates: list[float] = []
    try:
        conn = _connect(addr, port, deadline)
    except OSError as exc:
        refused_by = SELF if exc.errno in _OWN_ERRORS else PEER
        return LinkResult(None, 0.0, _why(exc), refused_by)
    try:
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            _bound(conn, deadline)
            conn.sendall(token)
            for _ in range(PINGS):
                sent = time.perf_counter()
                conn.sendall(b"p" + bytes(_MSG - 1))
                _read(conn, _MSG)
                trips.append(time.perf_counter() - sent)
                _bound(conn, deadline)
            for _ in range(TRANSFERS):
                sent = time.perf_counter()
                conn.sendall(b"t" + struct.pack("!I", PAYLOAD))
                moved = _send(conn, PAYLOAD, deadline)
                moved += _drain(conn, PAYLOAD, deadline)
                rates.append(moved / max(time.perf_counter() - sent, 1e-9) / 1e6)
                if moved < 2 * PAYLOAD:
                    break  # the deadline came: what moved by then is the figure
            return _result(trips, rates)
    except (OSError, EOFError) as exc:
        return _result(trips, rates, _why(exc))


def _connect(addr: str, port: int, deadline: float) -> socket.socket:
    """A connection to ``addr:port`` by the deadline, tried afresh every ``CONNECT_TRY``
    seconds (see the module's doc); raises the last attempt's error."""
    while True:
        began = time.monotonic()
        try:
            return socket.create_connection(
                (addr, port), timeout=max(min(CONNECT_TRY, deadline - began), 0.01)
            )
        except OSError:
            if time.monotonic() + 0.05 >= deadline:
                raise
        # An error that came at once (a reset, no route) is not retried in a tight loop
        time.sleep(max(0.0, min(began + 0.1, deadline) - time.monotonic()))


def _why(exc: BaseException) -> str:
    why = "no answer in time" if isinstance(exc, TimeoutError) else f"{exc}"
    return why or type(exc).__name__


def _result(trips: list[float], rates: list[float], error: str = "") -> LinkResult:
    latency = 1000 * sum(trips) / len(trips) if len(trips) == PINGS else None
    return LinkResult(latency, max(rates, default=0.0), error)


def _listen(addr: str) -> socket.socket:
    """A listening socket on ``addr`` (the address this node advertises); all interfaces
    when ``addr`` cannot be bound here (a name that resolves elsewhere)."""
    for host in (addr, ""):
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.bind((host, 0))
            sock.listen(16)
            return sock
        except OSError:
            sock.close()
    raise OSError(f"cannot listen on {addr} for the node check")


def _bound(conn: socket.socket, deadline: float) -> None:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    conn.settimeout(left)


def _read(conn: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise EOFError("the peer closed the connection")
        data += chunk
    return bytes(data)


def _drain(conn: socket.socket, size: int, deadline: float | None = None) -> int:
    """Read ``size`` bytes (by the deadline, if given: then what came by then counts)."""
    done = 0
    with contextlib.suppress(TimeoutError):
        while done < size:
            if deadline is not None:
                _bound(conn, deadline)
            chunk = conn.recv(min(_CHUNK, size - done))
            if not chunk:
                raise EOFError("the peer closed the connection")
            done += len(chunk)
    return done


def _send(conn: socket.socket, size: int, deadline: float | None = None) -> int:
    """Send ``size`` zero bytes (by the deadline, if given); return how many went."""
    block = bytes(_CHUNK)
    done = 0
    with contextlib.suppress(TimeoutError):
        while done < size:
            if deadline is not None:
                _bound(conn, deadline)
            done += conn.send(block[: min(_CHUNK, size - done)])
    return done
