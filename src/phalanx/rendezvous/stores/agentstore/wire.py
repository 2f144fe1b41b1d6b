"""The agent store's wire format: length-prefixed frames of length-prefixed fields, no pickle.

A frame is a 4-byte big-endian length and that many bytes; its payload is a sequence of
fields, each a 4-byte big-endian length and its bytes. A request's first field names the
operation (``OPS``); a reply's first field is ``OK`` or ``ERROR`` (then one field, the
reason). Frames are bounded (``MAX_FRAME``; ``MAX_HANDSHAKE_FRAME`` before a peer has
proved the token), so a peer cannot make the other side buffer without limit, and a
length that breaks the bound is junk at once rather than a wait for bytes that never come.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

MAX_FRAME = 4 << 20  # failure records carry log tails; the rendezvous writes nothing larger
MAX_HANDSHAKE_FRAME = 256
_LENGTH = struct.Struct(">I")
HEADER = _LENGTH.size

# Operations (a request's first field).
GET = b"get"
SET = b"set"
ADD = b"add"
COMPARE_SET = b"cas"
DELETE = b"del"
WAIT = b"wait"  # fields: timeout in milliseconds, then the keys
PING = b"ping"
OPS = frozenset({GET, SET, ADD, COMPARE_SET, DELETE, WAIT, PING})

# Reply status (a reply's first field), and the markers of absent/present values.
OK = b"ok"
ERROR = b"error"
ABSENT = b"-"
PRESENT = b"+"
TRUE = b"1"
FALSE = b"0"


class FrameError(ValueError):
    """Bytes that are not a frame of this protocol; the message says what was wrong."""


def encode(fields: Sequence[bytes]) -> bytes:
    """One frame holding ``fields``."""
    body = b"".join(_LENGTH.pack(len(field)) + field for field in fields)
    return _LENGTH.pack(len(body)) + body


def frame_length(header: bytes, limit: int) -> int:
    """The payload length a 4-byte header announces; ``FrameError`` past ``limit``."""
    length: int = _LENGTH.unpack(header)[0]
    if length > limit:
        raise FrameError(f"a frame of {length} bytes (the limit is {limit})")
    return length


def decode(payload: bytes) -> list[bytes]:
    """The fields of one frame's payload; ``FrameError`` when they do not fill it exactly."""
    fields: list[bytes] = []
    at = 0
    while at < len(payload):
        if at + HEADER > len(payload):
            raise FrameError("a field's length is cut off")
        length: int = _LENGTH.unpack_from(payload, at)[0]
        at += HEADER
        if at + length > len(payload):
            raise FrameError(f"a field of {length} bytes overruns its frame")
        fields.append(payload[at : at + length])
        at += length
    return fields


def split_frames(buffer: bytearray, limit: int) -> list[bytes]:
    """Remove every complete frame's payload from the front of ``buffer`` and return them
    (a partial frame stays for the next read); ``FrameError`` past ``limit``."""
    payloads: list[bytes] = []
    while len(buffer) >= HEADER:
        length = frame_length(bytes(buffer[:HEADER]), limit)
        if len(buffer) < HEADER + length:
            break
        payloads.append(bytes(buffer[HEADER : HEADER + length]))
        del buffer[: HEADER + length]
    return payloads


def encode_int(value: int) -> bytes:
    return str(value).encode("ascii")


def decode_int(field: bytes) -> int:
    """An integer written as ASCII digits (``FrameError`` otherwise)."""
    text = field.decode("ascii", "replace")
    if not text.lstrip("-").isdigit():
        raise FrameError(f"{_shown(field)} is not an integer")
    return int(text)


def _shown(field: bytes) -> str:
    return repr(field[:40]) + ("..." if len(field) > 40 else "")
