"""A loopback TCP proxy in front of an HTTP server that loses the reply to one request.

``DropOneReply(port, match)`` listens on 127.0.0.1 and relays every connection to
``127.0.0.1:port``. The first request whose bytes satisfy ``match`` is forwarded whole; once
the server has begun to answer it (so the server has acted on it) the proxy closes both
sides without relaying a byte of that answer: the client sees its connection drop after
sending, exactly a reply lost in the network, and has to resend. Everything else passes
through untouched. Threads only; every socket has a timeout, so nothing waits forever.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from types import TracebackType

_TIMEOUT = 30.0  # bounds every read: a stuck peer ends its relay instead of hanging a test


class DropOneReply:
    def __init__(self, upstream_port: int, match: Callable[[bytes], bool]) -> None:
        self._upstream = ("127.0.0.1", upstream_port)
        self._match = match
        self._lock = threading.Lock()
        self._armed = True
        self.dropped = threading.Event()  # set once a reply was dropped
        self.requests: list[bytes] = []  # every request seen, in order (head and body)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self._closing = threading.Event()
        self._sockets: list[socket.socket] = []
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def close(self) -> None:
        self._closing.set()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for thread in list(self._threads):
            thread.join(_TIMEOUT)
        self._listener.close()

    def __enter__(self) -> DropOneReply:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            server = socket.create_connection(self._upstream, timeout=_TIMEOUT)
            client.settimeout(_TIMEOUT)
            with self._lock:
                self._sockets += [client, server]
            # Replies flow in their own thread; requests are read whole in this one, so the
            # reply to a request is known to start after that request was forwarded (HTTP/1.1
            # without pipelining: the client waits for each reply before its next request).
            drop = threading.Event()
            for target, args in ((self._replies, (server, client, drop)),
                                 (self._requests, (client, server, drop))):  # fmt: skip
                thread = threading.Thread(target=target, args=args, daemon=True)
                self._threads.append(thread)
                thread.start()

    def _requests(
        self, client: socket.socket, server: socket.socket, drop: threading.Event
    ) -> None:
        buffer = b""
        with contextlib.suppress(OSError):
            while True:
                request, buffer = _read_request(client, buffer)
                if request is None:
                    break
                with self._lock:
                    self.requests.append(request)
                    if self._armed and self._match(request):
                        self._armed = False
                        drop.set()
                server.sendall(request)
                if drop.is_set():
                    return  # the reply thread closes both sides once the answer starts
        with contextlib.suppress(OSError):
            server.shutdown(socket.SHUT_WR)

    def _replies(self, server: socket.socket, client: socket.socket, drop: threading.Event) -> None:
        with contextlib.suppress(OSError):
            while data := server.recv(65536):
                if drop.is_set():
                    break  # the server answered the chosen request: lose that answer
                client.sendall(data)
        for sock in (client, server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        if drop.is_set():
            self.dropped.set()


def _read_request(sock: socket.socket, buffer: bytes) -> tuple[bytes | None, bytes]:
    """One HTTP/1.1 request (head and a ``Content-Length`` body), or None at end of stream."""
    while b"\r\n\r\n" not in buffer:
        chunk = sock.recv(65536)
        if not chunk:
            return None, buffer
        buffer += chunk
    head, _, rest = buffer.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            return None, buffer
        rest += chunk
    return head + b"\r\n\r\n" + rest[:length], rest[length:]
