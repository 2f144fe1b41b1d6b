"""Which address this node gives its peers, and whether a store endpoint is this machine."""

from __future__ import annotations

import ipaddress
import socket

import psutil


def local_addresses() -> set[str]:
    """Every IP address on this machine's (this network namespace's) interfaces."""
    found = set()
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family in (socket.AF_INET, socket.AF_INET6):
                found.add(a.address.split("%", 1)[0])  # drop an IPv6 zone ("fe80::1%eth0")
    return found


def resolve(host: str) -> set[str]:
    """The addresses ``host`` resolves to (none when it does not)."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return set()
    return {str(info[4][0]).split("%", 1)[0] for info in infos}


def _is_loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


def is_this_machine(host: str) -> bool:
    """Whether ``host`` names this machine: ``localhost``, a loopback address, this host's
    name, or a name/address that resolves to one of its interfaces (torchrun's heuristic)."""
    if host in ("localhost", socket.gethostname(), socket.getfqdn()) or _is_loopback(host):
        return True
    return bool(resolve(host) & local_addresses())


def node_address(store_host: str, store_port: int, local_addr: str | None = None) -> str:
    """The address the other nodes should use for this node (its MASTER_ADDR if rank 0).

    ``--local-addr`` wins. Otherwise the source address of the route to the store: the
    interface the other nodes share with us, and right inside containers and network
    namespaces where the host name resolves to nothing useful. A loopback route means the
    store runs on this machine: then, unless the endpoint itself was loopback (a one-machine
    job), the fully qualified host name, as torchrun uses.
    """
    if local_addr:
        return local_addr
    try:
        infos = socket.getaddrinfo(store_host, store_port, type=socket.SOCK_DGRAM)
        family, _, _, _, sockaddr = infos[0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(sockaddr)  # UDP: picks a route, sends nothing
            source = str(probe.getsockname()[0])
    except (OSError, IndexError):
        return socket.getfqdn()
    if not _is_loopback(source):
        return source
    if store_host == "localhost" or _is_loopback(store_host):
        return source
    return socket.getfqdn()
