"""The messages between the agent and the warm-start template, over one Unix socket.

The socket is ``SOCK_SEQPACKET``: every message arrives whole, with the file descriptors
sent alongside it (``SCM_RIGHTS``). A message is one JSON object. One bigger than
``INLINE_MAX`` (a fork request with a large environment: there is no limit but memory)
travels in a sealed memfd sent as the last fd, the packet saying only ``{"memfd": size}``;
``receive`` reads it back, so no caller sees the difference. The exchanges:

=========================  ==============================================================
template -> agent          ``{"ready": pid, "seconds": s, "threads": n}`` once, or
                           ``{"failed": "why"}`` and the template exits
agent -> template          ``{"forks": [ForkRequest, ...]}``: a round's workers (at most
                           ``BATCH``), with two fds for each, in order (its stdout and stderr
                           pipe write ends)
template -> agent          ``{"pids": [pid, ...]}`` and one fd for each (a pidfd of the new
                           worker), in order; with ``"error": "why"`` and ``"errno"`` when
                           a request could not be forked: the one after the last pid (the
                           rest were not tried)
template -> agent (async)  ``{"exit": pid, "status": wait_status}`` when a worker ends
=========================  ==============================================================

Imported by the template before torch, so it stays stdlib-only and small.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
from dataclasses import asdict, dataclass
from typing import Any

# A packet must fit the socket buffer, which the kernel caps (net.core.wmem_max, about 200
# KiB by default), or sending it fails with EMSGSIZE; so a message bigger than INLINE_MAX
# goes in a memfd instead (an environment of several MiB is legal: Linux execs up to about
# a quarter of the stack limit).
INLINE_MAX = 64 * 1024
MAX_MESSAGE = 2 * INLINE_MAX  # the socket buffers asked for, and the largest packet read
OUT_OF_LINE = "memfd"
# Fork requests in one message: two fds each, and a memfd, within the kernel's 253 fds a
# message may carry (SCM_MAX_FD). A round of more workers is sent as several.
BATCH = 64


class ProtocolError(Exception):
    """The peer sent something that is not a message of this protocol (or is gone)."""


@dataclass(frozen=True)
class ForkRequest:
    """One worker to fork: what ``python -u SCRIPT ARGS`` / ``python -u -m MODULE ARGS`` gets.

    ``kind`` is ``"script"`` or ``"module"``, or ``"boot"`` for ``python -u -c BOOT_SHIM
    ARGS`` (``target`` is then ``phalanx.worker.boot``); ``target`` the script path as the
    user typed it (relative to ``cwd``) or the module name; ``args`` the script's arguments; ``orig_argv``
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
    data = json.dumps(message).encode()
    if len(data) <= INLINE_MAX:
        socket.send_fds(sock, [data], list(fds))
        return
    body = os.memfd_create("phalanx-message", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        with memoryview(data) as view:
            written = 0
            while written < len(view):
                written += os.write(body, view[written:])
        # Sealed: what the receiver reads is what was sent, whoever else holds the fd.
        fcntl.fcntl(body, fcntl.F_ADD_SEALS, _SEALS)
        socket.send_fds(sock, [json.dumps({OUT_OF_LINE: len(data)}).encode()], [*fds, body])
    finally:
        os.close(body)


_SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE


def receive(sock: socket.socket, max_fds: int = 2) -> tuple[dict[str, Any], list[int]] | None:
    """The next message and the fds that came with it (at most ``max_fds``, besides a
    message's own memfd); None when the peer has closed."""
    data, fds, flags, _ = socket.recv_fds(sock, MAX_MESSAGE, max_fds + 1)
    if not data and not fds:
        return None
    try:
        if flags & socket.MSG_CTRUNC and not flags & socket.MSG_TRUNC:
            # The kernel drops the fds it cannot install in this process (the buffer has
            # room for every fd a message may carry): a descriptor limit, not a broken peer.
            raise OSError(errno.EMFILE, "the fds sent with a message could not be received")
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            raise ProtocolError("message truncated")
        message = _decode(data)
        if OUT_OF_LINE in message:
            if not fds:
                raise ProtocolError("a message sent in a memfd came without it")
            message = _decode(_read_memfd(fds.pop(), message[OUT_OF_LINE]))
        if len(fds) > max_fds:
            raise ProtocolError(f"{len(fds)} fds sent with a message, expected at most {max_fds}")
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return message, fds


def _decode(data: bytes) -> dict[str, Any]:
    try:
        message = json.loads(data)
    except ValueError as exc:
        raise ProtocolError(f"not a JSON message: {exc}") from None
    if not isinstance(message, dict):
        raise ProtocolError(f"expected a JSON object, got {type(message).__name__}")
    return message


def _read_memfd(fd: int, size: object) -> bytes:
    """The ``size`` bytes of a message's memfd (which is closed)."""
    try:
        if not isinstance(size, int) or size < 0 or os.fstat(fd).st_size != size:
            raise ProtocolError(f"a memfd message of {size!r} bytes has another size")
        chunks, offset = [], 0
        while offset < size:
            chunk = os.pread(fd, min(size - offset, 1 << 20), offset)
            if not chunk:
                raise ProtocolError("a memfd message ended early")
            chunks.append(chunk)
            offset += len(chunk)
        return b"".join(chunks)
    except OSError as exc:
        raise ProtocolError(f"cannot read a memfd message: {exc}") from None
    finally:
        os.close(fd)
