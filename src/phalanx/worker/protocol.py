"""The messages between the agent and the warm-start template, over one Unix socket.

The socket is ``SOCK_SEQPACKET``: every message arrives whole, with the file descriptors
sent alongside it (``SCM_RIGHTS``). A message is one JSON object. The exchanges:

=========================  ==============================================================
template -> agent          ``{"ready": pid, "seconds": s, "threads": n}`` once, or
                           ``{"failed": "why"}`` and the template exits
agent -> template          a ``ForkRequest`` and two fds (the worker's stdout and stderr
                           pipe write ends)
template -> agent          ``{"pid": pid}`` and one fd (a pidfd of the new worker), or
                           ``{"error": "why"}``
template -> agent (async)  ``{"exit": pid, "status": wait_status}`` when a worker ends
=========================  ==============================================================

Imported by the template before torch, so it stays stdlib-only and small.
"""

from __future__ import annotations

import json
import socket
from dataclasses import asdict, dataclass
from typing import Any

# Whole messages must fit the socket buffer, which the kernel caps (net.core.wmem_max, about
# 400 KiB by default); a bigger request fails with EMSGSIZE and that worker starts cold.
MAX_MESSAGE = 1024 * 1024


class ProtocolError(Exception):
    """The peer sent something that is not a message of this protocol (or is gone)."""


@dataclass(frozen=True)
class ForkRequest:
    """One worker to fork: what ``python -u SCRIPT ARGS`` / ``python -u -m MODULE ARGS`` gets.

    ``kind`` is ``"script"`` or ``"module"``; ``target`` the script path as the user typed it
    (relative to ``cwd``) or the module name; ``args`` the script's arguments; ``orig_argv``
    the command a cold start would have run (for ``sys.orig_argv``).
    """

    kind: str
    target: str
    args: tuple[str, ...]
    env: dict[str, str]
    cwd: str
    orig_argv: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ForkRequest:
        return cls(
            kind=str(data["kind"]),
            target=str(data["target"]),
            args=tuple(str(a) for a in data["args"]),
            env={str(k): str(v) for k, v in data["env"].items()},
            cwd=str(data["cwd"]),
            orig_argv=tuple(str(a) for a in data["orig_argv"]),
        )


def make_pair() -> tuple[socket.socket, socket.socket]:
    """A connected pair with buffers as large as the kernel allows (up to ``MAX_MESSAGE``)."""
    pair = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for end in pair:
        end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, MAX_MESSAGE)
        end.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, MAX_MESSAGE)
    return pair


def send(sock: socket.socket, message: dict[str, Any], fds: tuple[int, ...] = ()) -> None:
    socket.send_fds(sock, [json.dumps(message).encode()], list(fds))


def receive(sock: socket.socket, max_fds: int = 2) -> tuple[dict[str, Any], list[int]] | None:
    """The next message and the fds that came with it; None when the peer has closed."""
    data, fds, flags, _ = socket.recv_fds(sock, MAX_MESSAGE, max_fds)
    if not data and not fds:
        return None
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        for fd in fds:
            socket.close(fd)
        raise ProtocolError("message truncated")
    try:
        message = json.loads(data)
    except ValueError as exc:
        raise ProtocolError(f"not a JSON message: {exc}") from None
    if not isinstance(message, dict):
        raise ProtocolError(f"expected a JSON object, got {type(message).__name__}")
    return message, fds
