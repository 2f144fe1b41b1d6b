"""etcd's streaming replies (``watch``, ``lease/keepalive``): newline-delimited
``{"result": ...}`` objects, read within a deadline, in bounded memory, each checked by
``wire``; a line that is not etcd's is ``MalformedReply``, a stream that ends early
``StreamBroken``."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import requests

from phalanx.rendezvous.stores.base import MalformedReply, StoreUnavailable
from phalanx.rendezvous.stores.etcd.sessions import describe
from phalanx.rendezvous.stores.etcd.wire import BadReply, WatchResult, watch_result

# A stream line longer than this is not etcd's (its requests are capped at 1.5 MiB by default,
# and phalanx's watches carry only its own small keys): the buffer stays bounded.
_MAX_LINE = 16 * 1024 * 1024


class StreamBroken(StoreUnavailable):
    """A streaming reply ended before its deadline (the member went away or cancelled it)."""


def read_stream(
    reply: requests.Response, endpoint: str, path: str, deadline: float
) -> Iterator[WatchResult]:
    """Yield the checked results of a newline-delimited JSON stream until ``deadline``."""
    # The read timeout given to requests is per socket read, fixed when the request was
    # made; narrowing the socket's own timeout before each read keeps the whole wait
    # within ``deadline`` even when unrelated events keep arriving.
    sock = getattr(getattr(reply.raw, "connection", None), "sock", None)
    pending: list[bytes] = []  # the unfinished line, in pieces: no quadratic rejoining
    size = 0
    chunks = reply.iter_content(chunk_size=None)
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        if sock is not None:
            sock.settimeout(remaining)
        try:
            chunk = next(chunks, None)
        except requests.RequestException as exc:
            if time.monotonic() >= deadline - 0.05:
                return
            raise StreamBroken(f"etcd stream from {endpoint} broke: {describe(exc)}") from exc
        if chunk is None:
            raise StreamBroken(f"etcd at {endpoint} closed the stream")
        if b"\n" not in chunk:
            pending.append(chunk)
            size += len(chunk)
            if size > _MAX_LINE:
                why = f"a stream line longer than {_MAX_LINE} bytes"
                raise MalformedReply(f"etcd at {endpoint}", path, why)
            continue
        first, *lines, rest = chunk.split(b"\n")
        lines.insert(0, b"".join([*pending, first]))
        pending, size = [rest], len(rest)
        for line in lines:
            if line.strip():
                yield _stream_message(line, endpoint, path)


def _stream_message(line: bytes, endpoint: str, path: str) -> WatchResult:
    try:
        message = json.loads(line)
    except ValueError:
        raise MalformedReply(
            f"etcd at {endpoint}", path, f"a stream line is not JSON: {line[:60]!r}"
        ) from None
    if isinstance(message, dict) and "error" in message:
        detail = str(message["error"])[:300]
        raise StreamBroken(f"etcd stream from {endpoint} failed: {detail}")
    try:
        return watch_result(message)
    except BadReply as exc:
        raise MalformedReply(f"etcd at {endpoint}", path, str(exc)) from None
