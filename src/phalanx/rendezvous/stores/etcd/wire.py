"""The JSON spelling of etcd v3 messages on its gRPC-JSON gateway, both ways.

Keys and values are base64 strings; int64 fields (revisions, lease ids) are decimal strings;
fields holding their default value (``false``, ``0``, empty) are left out of replies.

The decoders (``range_reply``, ``txn_reply``, ...) check every field phalanx reads: its type,
its presence where etcd always sends it, and its base64. Anything else raises ``BadReply``
saying what was wrong; the client turns that into ``MalformedReply`` naming the endpoint and
the request. Nothing read from a reply reaches the store unchecked.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from typing import Any

JSON = dict[str, Any]


class BadReply(ValueError):
    """A reply does not have the shape etcd gives it; the message says which field and how."""


@dataclass(frozen=True)
class KV:
    key: bytes
    value: bytes  # empty for a keys-only range (and for an empty value: the gateway omits it)
    mod_revision: int


@dataclass(frozen=True)
class TxnReply:
    succeeded: bool
    revision: int  # the store's revision when the transaction ran (the header's)
    # One entry per operation of the branch that ran: a range's key-values, else ``None``.
    results: tuple[tuple[KV, ...] | None, ...]

    def first(self, index: int) -> KV | None:
        """What the ``index``-th operation (a range) found, ``None`` when the key is absent."""
        found = self.results[index]
        return found[0] if found else None


@dataclass(frozen=True)
class WatchEvent:
    key: bytes
    deleted: bool
    revision: int  # the revision that made the change (a delete's own, not the key's last put)


@dataclass(frozen=True)
class WatchResult:
    created: bool  # the reply that says the watcher exists (etcd sends it before any event)
    canceled: bool
    cancel_reason: str
    events: tuple[WatchEvent, ...]


# -- requests ------------------------------------------------------------------------------


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def compare_absent(key: bytes) -> JSON:
    return {"key": b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}


def compare_present(key: bytes) -> JSON:
    return {"key": b64(key), "target": "CREATE", "result": "GREATER", "create_revision": "0"}


def compare_mod(key: bytes, revision: int) -> JSON:
    return {"key": b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": str(revision)}


def compare_value(key: bytes, value: bytes) -> JSON:
    return {"key": b64(key), "target": "VALUE", "result": "EQUAL", "value": b64(value)}


def put_op(key: bytes, value: bytes) -> JSON:
    return {"request_put": {"key": b64(key), "value": b64(value)}}


def range_op(key: bytes, *, keys_only: bool = False) -> JSON:
    return {"request_range": {"key": b64(key), "keys_only": keys_only}}


def delete_op(key: bytes) -> JSON:
    return {"request_delete_range": {"key": b64(key)}}


def delete_range_op(start: bytes, end: bytes) -> JSON:
    """Delete the keys in ``[start, end)``."""
    return {"request_delete_range": {"key": b64(start), "range_end": b64(end)}}


# -- replies -------------------------------------------------------------------------------


def acknowledged(reply: JSON) -> None:
    """A reply that carries nothing but etcd's header (put, delete, revoke): only a reply
    with one counts as done, so junk is never taken for a write that happened."""
    _revision(reply, "reply")


def range_reply(reply: JSON) -> tuple[KV, ...]:
    """The key-values of a ``kv/range`` reply (checked: a header with a revision, then kvs)."""
    _revision(reply, "reply")
    return _kvs(reply, "reply")


def txn_reply(request: JSON, reply: JSON) -> TxnReply:
    """A ``kv/txn`` reply to ``request``: one response of the right kind per operation of
    the branch that ran (``succeeded`` is left out when false, ``responses`` never is)."""
    succeeded = _field(reply, "succeeded", bool, "reply", default=False)
    if not request.get("compare") and not succeeded:
        raise BadReply("a transaction without conditions did not succeed")
    ops: list[JSON] = request.get("success" if succeeded else "failure") or []
    responses = _field(reply, "responses", list, "reply", default=[])
    if len(responses) != len(ops):
        branch = "success" if succeeded else "failure"
        raise BadReply(
            f"{len(responses)} responses to the {len(ops)} operations of its {branch} branch"
        )
    results: list[tuple[KV, ...] | None] = []
    for i, (op, response) in enumerate(zip(ops, responses, strict=True)):
        where = f"responses[{i}]"
        if not isinstance(response, dict):
            raise BadReply(f"{where} is {_show(response)}, not an object")
        (kind,) = op  # "request_range" -> "response_range", ...
        found = _field(response, kind.replace("request_", "response_", 1), dict, where)
        results.append(_kvs(found, where) if kind == "request_range" else None)
    return TxnReply(succeeded, _revision(reply, "reply"), tuple(results))


def lease_grant(reply: JSON) -> tuple[int, int]:
    """The granted lease's id and TTL (etcd may raise the TTL asked for to its minimum)."""
    lease_id = _int(reply, "ID", "reply")
    ttl = _int(reply, "TTL", "reply")
    if lease_id == 0 or ttl <= 0:
        raise BadReply(f"granted lease {lease_id} with TTL {ttl}")
    return lease_id, ttl


def keepalive_ttl(reply: JSON) -> int:
    """The TTL a keep-alive renewed the lease to; 0 (etcd leaves it out) when it expired."""
    result = _field(reply, "result", dict, "reply")
    ttl = _int(result, "TTL", "result", default=0)
    if ttl < 0:
        raise BadReply(f"result.TTL is {ttl}")
    return ttl


def auth_token(reply: JSON) -> str:
    token: str = _field(reply, "token", str, "reply")
    if not token:
        raise BadReply("reply.token is empty")
    return token


def watch_result(message: object) -> WatchResult:
    """One line of a ``watch`` stream (``{"result": ...}``; errors are handled before)."""
    if not isinstance(message, dict):
        raise BadReply(f"a stream line is {_show(message)}, not an object")
    result = _field(message, "result", dict, "line")
    events: list[WatchEvent] = []
    for i, event in enumerate(_field(result, "events", list, "result", default=[])):
        where = f"result.events[{i}]"
        if not isinstance(event, dict):
            raise BadReply(f"{where} is {_show(event)}, not an object")
        kind = _field(event, "type", str, where, default="PUT")
        if kind not in ("PUT", "DELETE"):
            raise BadReply(f"{where}.type is {_show(kind)}, not PUT or DELETE")
        kv = _field(event, "kv", dict, where)
        at = f"{where}.kv"
        events.append(
            WatchEvent(_b64(kv, "key", at), kind == "DELETE", _int(kv, "mod_revision", at))
        )
    return WatchResult(
        created=_field(result, "created", bool, "result", default=False),
        canceled=_field(result, "canceled", bool, "result", default=False),
        cancel_reason=_field(result, "cancel_reason", str, "result", default=""),
        events=tuple(events),
    )


# -- field checks --------------------------------------------------------------------------

_MISSING = object()
_DECIMAL = re.compile(r"-?[0-9]{1,20}")  # int64, as the gateway spells it (no "+", "_", "1e3")


def _field(obj: JSON, name: str, kind: type[Any], where: str, *, default: Any = _MISSING) -> Any:
    value = obj.get(name, _MISSING)
    if value is _MISSING:
        if default is _MISSING:
            raise BadReply(f"{where} has no {name!r} (keys: {_show(sorted(obj))})")
        return default
    # bool is an int in Python, and no int field of etcd's is ever a JSON boolean.
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise BadReply(f"{where}.{name} is {_show(value)}, not {kind.__name__}")
    return value


def _int(obj: JSON, name: str, where: str, *, default: int | None = None) -> int:
    """An int64 field: a decimal string on the gateway (a bare number is accepted too)."""
    value = obj.get(name, _MISSING)
    if value is _MISSING:
        if default is None:
            raise BadReply(f"{where} has no {name!r} (keys: {_show(sorted(obj))})")
        return default
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and _DECIMAL.fullmatch(value):
        return int(value)
    raise BadReply(f"{where}.{name} is {_show(value)}, not an integer")


def _b64(obj: JSON, name: str, where: str, *, optional: bool = False) -> bytes:
    text = _field(obj, name, str, where, default="" if optional else _MISSING)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise BadReply(f"{where}.{name} is {_show(text)}, not base64") from None


def _revision(reply: JSON, where: str) -> int:
    header = _field(reply, "header", dict, where)
    return _int(header, "revision", f"{where}.header")


def _kvs(found: JSON, where: str) -> tuple[KV, ...]:
    kvs: list[KV] = []
    for i, kv in enumerate(_field(found, "kvs", list, where, default=[])):
        at = f"{where}.kvs[{i}]"
        if not isinstance(kv, dict):
            raise BadReply(f"{at} is {_show(kv)}, not an object")
        kvs.append(
            KV(
                key=_b64(kv, "key", at),
                value=_b64(kv, "value", at, optional=True),
                mod_revision=_int(kv, "mod_revision", at),
            )
        )
    return tuple(kvs)


def _show(value: object) -> str:
    """A short rendering of a junk value for an error message (it may be large, or hostile)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
