"""A process on the store's port that plays the server's side of the handshake without the token.

It greets as a phalanx agent store does (``GREETING`` and a fresh nonce), takes the client's
proof, and answers ``OK`` with 32 random bytes where the server's HMAC proof belongs: what an
impostor that does not know the token can do at best. Whatever a client sends after that is
appended to a file: a client that checks the server's proof sends nothing more, one that
does not goes on with its requests (``set master ...``) and they land there.

Run as ``python impostor.py PORT RECORD`` (a squatter in a process of its own), or use
``Impostor`` in a thread of the test. Plain sockets, every read bounded.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
from pathlib import Path

from phalanx.rendezvous.stores.agentstore import auth, wire

_TIMEOUT = 10.0  # a client that says nothing for this long is dropped


def _read_frame(conn: socket.socket) -> list[bytes] | None:
    header = _read(conn, wire.HEADER)
    if header is None:
        return None
    body = _read(conn, wire.frame_length(header, wire.MAX_HANDSHAKE_FRAME))
    return None if body is None else wire.decode(body)


def _read(conn: socket.socket, size: int) -> bytes | None:
    got = bytearray()
    while len(got) < size:
        chunk = conn.recv(size - len(got))
        if not chunk:
            return None
        got += chunk
    return bytes(got)


def answer(conn: socket.socket, record: Path) -> None:
    """One connection: greet, take the proof, answer a forged one, record the rest."""
    with conn, contextlib.suppress(OSError, wire.FrameError):
        conn.settimeout(_TIMEOUT)
        conn.sendall(wire.encode([auth.GREETING, auth.new_nonce()]))
        if _read_frame(conn) is None:  # a reachability probe: connected and closed
            return
        conn.sendall(wire.encode([wire.OK, os.urandom(32)]))
        while chunk := conn.recv(65536):
            with open(record, "ab") as out:
                out.write(chunk)


class Impostor:
    """``Impostor(record)`` listens on 127.0.0.1 (``port``) in a thread until ``close``."""

    def __init__(self, record: Path) -> None:
        self._record = record
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port: int = self._listener.getsockname()[1]
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._closing.set()
        self._thread.join(_TIMEOUT + 5)
        self._listener.close()

    def _serve(self) -> None:
        while not self._closing.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=answer, args=(conn, self._record), daemon=True).start()


def main() -> None:
    port, record = int(sys.argv[1]), Path(sys.argv[2])
    with socket.create_server(("127.0.0.1", port)) as listener:
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=answer, args=(conn, record), daemon=True).start()


if __name__ == "__main__":
    main()
