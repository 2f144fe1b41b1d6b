"""Pure parsers for the values users type: node ranges, endpoints, rank lists, stream specs.

Each returns plain data or raises ``ValueError`` with a message that says what was given and
what was expected; the CLI collects those messages and reports them all at once.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

_HOST_PORT = re.compile(r"^(?P<host>[^:\[\]]+)(:(?P<port>[^:]*))?$")
_IPV6_PORT = re.compile(r"^\[(?P<host>[0-9A-Fa-f:.]+)\](:(?P<port>[^:]*))?$")


def parse_int(text: str, what: str, *, minimum: int | None = None) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise ValueError(f"{what}: expected an integer, got {text!r}") from None
    if minimum is not None and value < minimum:
        raise ValueError(f"{what}: expected an integer >= {minimum}, got {value}")
    return value


def parse_float(text: str, what: str, *, minimum: float | None = None) -> float:
    """A finite number (``inf`` and ``nan`` are refused: every duration phalanx takes must
    end), at least ``minimum``."""
    try:
        value = float(str(text).strip())
    except ValueError:
        raise ValueError(f"{what}: expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"{what}: expected a finite number of seconds, got {text!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{what}: expected a number >= {minimum}, got {value}")
    return value


def parse_nnodes(text: str) -> tuple[int, int]:
    """``"N"`` -> (N, N); ``"MIN:MAX"`` -> (MIN, MAX) with 1 <= MIN <= MAX."""
    parts = str(text).split(":")
    if len(parts) > 2:
        raise ValueError(f"--nnodes: expected N or MIN:MAX, got {text!r}")
    try:
        low = parse_int(parts[0], "--nnodes", minimum=1)
        high = parse_int(parts[-1], "--nnodes", minimum=1)
    except ValueError:
        raise ValueError(
            f"--nnodes: expected N or MIN:MAX with positive integers, got {text!r}"
        ) from None
    if (problem := node_range_problem(low, high)) is not None:
        raise ValueError(problem)
    return low, high


def node_range_problem(min_nodes: int, max_nodes: int) -> str | None:
    """The one check of a node range (the CLI's ``--nnodes`` and a spec's, ``phalanx.spawn``'s
    included): None when ``1 <= MIN <= MAX``."""
    if 1 <= min_nodes <= max_nodes:
        return None
    return (
        f"--nnodes: MIN must not exceed MAX, got {min_nodes}:{max_nodes} (expected 1 <= MIN <= MAX)"
    )


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int | None


def parse_endpoint(text: str, what: str = "--rdzv-endpoint") -> Endpoint:
    """``host``, ``host:port`` or ``[ipv6]:port``; an empty string means "not given"."""
    text = str(text).strip()
    match = _IPV6_PORT.match(text) or _HOST_PORT.match(text)
    if not text or match is None:
        raise ValueError(f"{what}: expected host[:port] or [ipv6]:port, got {text!r}")
    port_text = match.group("port")
    port = None
    if port_text is not None:
        port = parse_int(port_text, f"{what} port", minimum=0)
        if port > 65535:
            raise ValueError(f"{what}: port must be 0..65535, got {port}")
    return Endpoint(match.group("host"), port)


_HOST = re.compile(r"^[A-Za-z0-9._%-]+$|^[0-9A-Fa-f:.%]+$|^\[[0-9A-Fa-f:.%]+\]$")


def check_host(text: str, what: str) -> str:
    """A host name or an IP address (v6 with or without brackets), as given."""
    text = str(text).strip()
    if not _HOST.match(text):
        raise ValueError(f"{what}: expected a host name or an IP address, got {text!r}")
    return text


def parse_kv_list(text: str, what: str) -> dict[str, str]:
    """``"a=1,b=2"`` -> ``{"a": "1", "b": "2"}``; every item needs ``=`` and a key. A bad item
    is counted, not quoted: it may be the tail of a secret that held a comma.

    Quotes around the whole list (``"'a=1,b=2'"``, a shell quoting that reached the program
    unquoted, as in PyTorch's own torchrun tests) are dropped: torchrun would read them as
    part of the first key and the last value, and ignore both."""
    result: dict[str, str] = {}
    text = str(text).strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1]
    items = list(filter(None, (part.strip() for part in text.split(","))))
    for number, item in enumerate(items, 1):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(
                f"{what}: expected key=value[,key=value...]; item {number} of {len(items)} "
                "is not key=value (a value cannot hold a comma)"
            )
        result[key.strip()] = value.strip()
    return result


def parse_rank_list(text: str, what: str) -> frozenset[int]:
    """``"0,2,3"`` -> {0, 2, 3}."""
    try:
        return frozenset(
            parse_int(part, what, minimum=0) for part in str(text).split(",") if part.strip()
        )
    except ValueError:
        raise ValueError(f"{what}: expected comma-separated ranks like 0,1, got {text!r}") from None


# torchrun's Std values: 0 none, 1 stdout, 2 stderr, 3 both.
_STD_BITS = {
    0: frozenset(),
    1: frozenset({"stdout"}),
    2: frozenset({"stderr"}),
    3: frozenset({"stdout", "stderr"}),
}


def parse_std_spec(text: str, what: str, nproc: int) -> dict[int, frozenset[str]]:
    """torchrun's ``-r/-t`` syntax: ``"3"`` for every local rank, or ``"0:1,1:2"`` per rank."""
    text = str(text).strip()

    def bits(value: str) -> frozenset[str]:
        number = parse_int(value, what)
        if number not in _STD_BITS:
            raise ValueError(
                f"{what}: expected 0 (none), 1 (stdout), 2 (stderr) or 3 (both), got {value!r}"
            )
        return _STD_BITS[number]

    if ":" not in text:
        every = bits(text)
        return {rank: every for rank in range(nproc)}
    spec: dict[int, frozenset[str]] = {rank: frozenset() for rank in range(nproc)}
    for item in filter(None, text.split(",")):
        rank_text, sep, value = item.partition(":")
        if not sep:
            raise ValueError(f"{what}: expected N or RANK:N[,RANK:N...], got {text!r}")
        spec[parse_int(rank_text, what, minimum=0)] = bits(value)
    return spec


def parse_filter_words(text: str) -> tuple[str, ...]:
    """torchrun's duplicate filters: comma-separated words, ``,,`` for a literal comma."""
    placeholder = "\0"
    words = str(text).replace(",,", placeholder).split(",")
    return tuple(word.replace(placeholder, ",") for word in words if word)


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """``"; did you mean X?"`` for the closest of ``known``, or ``""``."""
    import difflib  # only for a mistake: not on every launch's path (with heapq, ~1.5 ms)

    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""
