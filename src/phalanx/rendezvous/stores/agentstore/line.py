"""One client connection of the agent store, its requests and replies in as few system calls
as they allow.

Every system call of a Python socket lets go of the interpreter's lock, and in a process
with many threads that talk to the store (an agent's: its own, the heartbeat's, the
watch's; a benchmark driver's: hundreds) each let-go hands the lock to another thread and
back, two context switches. A socket with a Python timeout also polls before every send and
receive: a call was poll+send, poll+recv for the header, poll+recv for the body. So once a
connection has passed the handshake it is put in blocking mode with the kernel's own
timeouts (``SO_RCVTIMEO``, ``SO_SNDTIMEO``: the same bound on each send and receive as
before) and a reply is read in one ``recv`` when it fits: a call is a send and a receive.
A receive that times out raises ``TimeoutError``, as a Python timeout does.
"""

from __future__ import annotations

import socket
import struct

from phalanx.rendezvous.stores.agentstore import wire

_FIRST_READ = 65536  # one receive takes any reply the rendezvous makes but a membership's
_TIMEVAL = struct.Struct("@ll")


class Line:
    """An authenticated connection: ``bound`` its calls, ``send`` a frame, ``receive`` one."""

    __slots__ = ("sock", "timeout")

    def __init__(self, sock: socket.socket) -> None:
        sock.settimeout(None)  # blocking: no poll before each send and receive
        self.sock = sock
        self.timeout = 0.0  # seconds each send and receive may take; 0: not set yet

    def bound(self, seconds: float) -> None:
        """Bound each send and receive to ``seconds`` (a system call only when it changes)."""
        seconds = max(0.001, seconds)  # a zero timeval means no bound at all
        if seconds != self.timeout:
            whole = int(seconds)
            timeval = _TIMEVAL.pack(whole, int((seconds - whole) * 1_000_000))
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)
            self.timeout = seconds

    def send(self, frame: bytes) -> None:
        try:
            self.sock.sendall(frame)
        except BlockingIOError:
            raise TimeoutError from None

    def receive(self, limit: int, count: int = 1) -> list[list[bytes]]:
        """The fields of the next ``count`` replies (``wire.FrameError`` for junk;
        ``TimeoutError``, ``OSError`` from the socket)."""
        try:
            if count == 1:
                return [wire.decode(read_frame(self.sock, limit))]
            return [wire.decode(payload) for payload in _read_frames(self.sock, limit, count)]
        except BlockingIOError:
            raise TimeoutError from None

    def close(self) -> None:
        self.sock.close()


def read_frame(sock: socket.socket, limit: int) -> bytes:
    """The payload of the next frame on ``sock``, read in one ``recv`` when it fits. Only one
    request is ever in flight on a connection, so nothing may follow its reply: bytes past
    the frame are junk (``wire.FrameError``)."""
    data = _recv(sock, _FIRST_READ)
    while len(data) < wire.HEADER:
        data += _recv(sock, wire.HEADER - len(data))
    end = wire.HEADER + wire.frame_length(data[: wire.HEADER], limit)
    if len(data) > end:
        raise wire.FrameError(f"{len(data) - end} bytes past the end of the reply")
    if len(data) == end:
        return data[wire.HEADER :]
    rest = bytearray(data)
    while len(rest) < end:
        rest += _recv(sock, end - len(rest))
    return bytes(rest[wire.HEADER :])


def _read_frames(sock: socket.socket, limit: int, count: int) -> list[bytes]:
    """The payloads of the next ``count`` frames (the replies to as many requests sent
    together, which the server answers in order); bytes past them are junk."""
    buffer = bytearray()
    payloads: list[bytes] = []
    while len(payloads) < count:
        buffer += _recv(sock, _FIRST_READ)
        payloads += wire.split_frames(buffer, limit)
    if len(payloads) > count or buffer:
        raise wire.FrameError("bytes past the end of the replies")
    return payloads


def _recv(sock: socket.socket, size: int) -> bytes:
    chunk = sock.recv(size)
    if not chunk:
        raise ConnectionResetError(0, "the server closed the connection")
    return chunk
