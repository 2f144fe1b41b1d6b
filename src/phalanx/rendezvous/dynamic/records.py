"""How the rendezvous writes and reads its values: JSON objects (``encode``, ``decode``),
counters (``count_in``) and the fields of a record (``parsed``), each malformed value a
``MalformedValue`` naming its key (a peer that wrote junk, or another program's key)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from phalanx.rendezvous.stores.base import MalformedValue

T = TypeVar("T")


def encode(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def decode(data: bytes, key: str = "?") -> dict[str, Any]:
    """A JSON object as phalanx writes it; ``MalformedValue`` naming ``key`` otherwise."""
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise MalformedValue(key, f"not JSON: {data[:80]!r}") from None
    if not isinstance(value, dict):
        raise MalformedValue(key, f"expected a JSON object, got {data[:80]!r}")
    return value


def integer(key: str, data: bytes) -> int:
    """A counter's value as read from ``key``."""
    try:
        return int(data)
    except ValueError:
        raise MalformedValue(key, f"expected an integer, got {data[:80]!r}") from None


def count_in(key: str, data: bytes | None) -> int:
    """A counter's value as read from ``key`` (absent: 0)."""
    return 0 if data is None else integer(key, data)


def parsed(key: str, body: dict[str, Any], parse: Callable[[dict[str, Any]], T]) -> T:
    """``parse(body)``, with a missing or mistyped field a ``MalformedValue`` naming ``key``."""
    try:
        return parse(body)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise MalformedValue(key, f"{type(exc).__name__}: {exc} in {str(body)[:120]}") from None
