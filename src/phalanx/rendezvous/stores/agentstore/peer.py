"""One connection of the agent store's server (``server.StoreServer``): its state, its bytes
in and out, and how a whole frame is taken from what it sent."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

from phalanx.rendezvous.stores.agentstore import wire


@dataclass(eq=False)
class Peer:
    """One connection as the server sees it: its handshake, its unread and unsent bytes,
    its parked wait."""

    sock: socket.socket
    name: str
    nonce: bytes
    deadline: float  # for the handshake; float("inf") once authenticated
    authenticated: bool = False
    inbox: bytearray = field(default_factory=bytearray)
    outbox: bytearray = field(default_factory=bytearray)
    waiting: float | None = None  # the deadline of its parked wait
    closing: bool = False  # close once the outbox is sent
    heard: bool = False  # sent at least one byte


def take_frame(peer: Peer) -> list[bytes] | None:
    """The next whole frame in ``peer``'s inbox, decoded and removed from it; ``None`` while
    it is not all there. Before the handshake only small frames are allowed. Raises
    ``wire.FrameError`` for junk."""
    limit = wire.MAX_FRAME if peer.authenticated else wire.MAX_HANDSHAKE_FRAME
    if len(peer.inbox) < wire.HEADER:
        return None
    length = wire.frame_length(bytes(peer.inbox[: wire.HEADER]), limit)
    if len(peer.inbox) < wire.HEADER + length:
        return None
    payload = bytes(peer.inbox[wire.HEADER : wire.HEADER + length])
    del peer.inbox[: wire.HEADER + length]
    return wire.decode(payload)


def peer_name(address: object) -> str:
    if isinstance(address, tuple) and len(address) >= 2:
        host, port = address[0], address[1]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return str(address)
