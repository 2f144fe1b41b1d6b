"""The wait for a store's greeting on a first connection, said while it lasts.

A phalanx store speaks first. A port held by a process that accepts and never speaks (not
a phalanx store, or a hung one) is otherwise a minute of silence, so the client says every
``REPORT_EVERY`` seconds what it waits for, until ``read_timeout``.
"""

from __future__ import annotations

import logging
import socket
import time

from phalanx.rendezvous.stores.base import StoreTimedOut
from phalanx.rendezvous.stores.reach import REPORT_EVERY

log = logging.getLogger("phalanx")

HANDSHAKE = "the handshake"
NOT_A_STORE = " (a phalanx store speaks first: the process on that port is not one, or hangs)"


def await_greeting(sock: socket.socket, where: str, read_timeout: float) -> None:
    """Wait up to ``read_timeout`` for the server's first byte on ``sock`` (``where``, in
    words). Leaves the socket's timeout at ``read_timeout``. Raises ``StoreTimedOut``."""
    start = time.monotonic()
    deadline = start + read_timeout
    try:
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(max(0.01, min(REPORT_EVERY, left)))
            try:
                sock.recv(1, socket.MSG_PEEK)  # the greeting, or the end: either is an answer
                return
            except TimeoutError:
                if deadline - time.monotonic() > 0:
                    log.warning(
                        "rendezvous: %s accepted the connection but has said nothing for "
                        "%.0f s (a phalanx store speaks first: the process on that port is "
                        "not one, or hangs); waiting for its greeting for another %.0f s "
                        "(read_timeout)",
                        where, time.monotonic() - start, deadline - time.monotonic(),
                    )  # fmt: skip
            except OSError:
                return  # a reset: the caller's receive says it
        within = f"within {read_timeout:g} s{NOT_A_STORE}"
        raise StoreTimedOut(f"{where} did not answer {HANDSHAKE} {within}")
    finally:
        sock.settimeout(read_timeout)
