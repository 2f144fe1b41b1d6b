"""Where the agent store listens: only on the address its endpoint names.

``127.0.0.1`` stays on loopback, a name binds the address it resolves to, and ``0.0.0.0``
(or ``::``) means every interface. One exception (``bind_address``): a host name other than
``localhost`` that resolves here to loopback only (Debian's ``127.0.1.1 myhost`` in
``/etc/hosts``) names this machine to the other nodes, which resolve it to its real address;
binding loopback would lock them out, so every interface is bound then, and a line says so
(the token still guards every connection).
"""

from __future__ import annotations

import ipaddress
import logging
import socket

log = logging.getLogger("phalanx")

_BACKLOG = 4096  # the kernel caps it at net.core.somaxconn


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
