"""The agents' own key-value store: authenticated, no pickle, no torch (see ``server``).

Re-exported lazily: a one-node launch reads ``conf`` (the --rdzv-conf keys, the token) and
must not import the store's client and server with it.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from phalanx.rendezvous.stores.agentstore.auth import NO_TOKEN, Token
    from phalanx.rendezvous.stores.agentstore.client import AgentKVStore, TokenRefused
    from phalanx.rendezvous.stores.agentstore.server import StoreServer

_WHERE = {"NO_TOKEN": "auth", "Token": "auth", "AgentKVStore": "client", "TokenRefused": "client",
          "StoreServer": "server"}  # fmt: skip

__all__ = ["NO_TOKEN", "AgentKVStore", "StoreServer", "Token", "TokenRefused"]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value
