"""A loopback TCP proxy whose replies can be made slow: a store that answers late but answers.

``SlowReplies(port)`` listens on 127.0.0.1 (``port``) and relays every connection to
``127.0.0.1:<upstream port>``. Requests go through at once, so the server acts on them when
they are sent; each chunk of the server's answer is held ``delay`` seconds (0 at first; set it
at any time) before it is passed on, as on a link whose return path is slow. Threads only;
every socket has a timeout, so nothing waits forever.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

_TIMEOUT = 60.0  # bounds every read: a stuck peer ends its relay instead of hanging a test


class SlowReplies:
    def __init__(self, upstream_port: int) -> None:
        self._upstream = ("127.0.0.1", upstream_port)
        self.delay = 0.0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port: int = self._listener.getsockname()[1]
        self._closing = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._closing.set()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
        self._listener.close()

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                server = socket.create_connection(self._upstream, timeout=_TIMEOUT)
            except OSError:
                client.close()
                continue
            for sock in (client, server):
                sock.settimeout(_TIMEOUT)
            with self._lock:
                self._sockets += [client, server]
            threading.Thread(target=self._relay, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._relay, args=(server, client, True), daemon=True).start()

    def _relay(self, source: socket.socket, target: socket.socket, slow: bool) -> None:
        with contextlib.suppress(OSError):
            while chunk := source.recv(65536):
                if slow and self.delay > 0:
                    time.sleep(self.delay)  # the slow link itself, not a test's synchronisation
                target.sendall(chunk)
        with contextlib.suppress(OSError):
            target.shutdown(socket.SHUT_WR)
