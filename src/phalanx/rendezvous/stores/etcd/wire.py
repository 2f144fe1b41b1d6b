"""The JSON spelling of etcd v3 messages on its gRPC-JSON gateway.

Keys and values are base64 strings; int64 fields (revisions, lease ids) are decimal strings;
fields holding their default value (``false``, ``0``, empty) are left out of replies.
"""

from __future__ import annotations

import base64
from typing import Any

JSON = dict[str, Any]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: str) -> bytes:
    return base64.b64decode(text)


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


def first_kv(range_reply: JSON) -> JSON | None:
    """The first key-value of a range reply, ``None`` when the key is absent."""
    kvs = range_reply.get("kvs") or []
    return dict(kvs[0]) if kvs else None


def kv_value(kv: JSON) -> bytes:
    return unb64(kv.get("value", ""))  # the gateway omits empty (default) fields


def txn_kv(reply: JSON, index: int) -> JSON | None:
    """What the ``index``-th range of a transaction found, ``None`` when the key is absent."""
    responses = reply.get("responses") or []
    return first_kv(responses[index].get("response_range", {})) if index < len(responses) else None
