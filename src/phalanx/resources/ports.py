"""Small network helpers."""

from __future__ import annotations

import socket


def free_port(host: str = "") -> int:
    """A TCP port that is free right now on ``host`` (all interfaces by default).

    The port is released before returning, so another process can in principle take it
    before the worker binds it; that window is the same one torchrun's ``--standalone`` has.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
