"""Waiting for a rendezvous endpoint to answer, saying why while it does not.

A name that does not resolve fails at once: retrying would only repeat the same answer for
the whole ``join_timeout`` (and torch's client prints a C++ warning each time). An address
that resolves but does not answer -- nothing listens yet, a firewall drops the packets --
is normal for a while (the store's host may start later), so it is tried until the
deadline, with one line every ``REPORT_EVERY`` seconds naming the address, the reason and
the time left.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Sequence
from typing import Any

from phalanx.rendezvous.stores.base import StoreUnavailable

log = logging.getLogger("phalanx")

REPORT_EVERY = 5.0
ATTEMPT = 1.0  # seconds one connection attempt may take (a filtered port never answers)


def hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _attempt(addresses: Sequence[tuple[int, Any]], timeout: float) -> str | None:
    """Try each address once; None when one accepted a connection, else why not."""
    reason = "no address"
    for family, sockaddr in addresses:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.settimeout(timeout)
            try:
                probe.connect(sockaddr)
            except TimeoutError:
                reason = f"no answer within {timeout:g} s (filtered, or the host is down)"
            except OSError as exc:
                reason = exc.strerror or str(exc)
            else:
                return None
    return reason


def wait_reachable(host: str, port: int, timeout: float, what: str) -> float:
    """Block until ``host:port`` accepts a TCP connection, at most ``timeout`` seconds;
    return the seconds left. Raises ``StoreUnavailable`` naming the host and why: at once
    when the name does not resolve, else when the time is up."""
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise StoreUnavailable(f"cannot resolve {host!r} ({exc.strerror})") from None
    addresses = [(family, sockaddr) for family, _, _, _, sockaddr in found]
    start = time.monotonic()
    deadline = start + timeout
    next_report = start + REPORT_EVERY
    while True:
        reason = _attempt(addresses, max(0.01, min(ATTEMPT, deadline - time.monotonic())))
        now = time.monotonic()
        if reason is None:
            return deadline - now
        if now >= deadline:
            raise StoreUnavailable(
                f"{what} at {hostport(host, port)} did not answer within {timeout:g} s: {reason}"
            )
        if now >= next_report:
            log.warning(
                "rendezvous: %s at %s: %s; trying for another %.0f s (join_timeout)",
                what, hostport(host, port), reason, deadline - now,
            )  # fmt: skip
            next_report = now + REPORT_EVERY
        time.sleep(min(0.25, max(0.0, deadline - now)))
