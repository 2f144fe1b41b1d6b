"""The bytes ``workers/flood.py`` writes, in chunks of 1 MiB, for the tests to check."""

from __future__ import annotations

from collections.abc import Iterator

_LINE = 128  # bytes per numbered line: 1 MiB is 8192 of them


def numbered_lines(mib: int) -> Iterator[bytes]:
    """``mib`` MiB of lines ``00000000 ooo...o\\n``, numbered from 0."""
    per_chunk = (1 << 20) // _LINE
    for chunk in range(mib):
        first = chunk * per_chunk
        yield b"".join(
            b"%08d " % n + b"o" * (_LINE - 10) + b"\n" for n in range(first, first + per_chunk)
        )


def long_line(mib: int) -> Iterator[bytes]:
    """``mib`` MiB without a newline: each MiB its own number, then the alphabet over."""
    body = b"abcdefghijklmnopqrstuvwxyz" * ((1 << 20) // 26 + 1)
    for chunk in range(mib):
        head = b"[%06d]" % chunk
        yield head + body[: (1 << 20) - len(head)]
