"""The agents' own key-value store: authenticated, no pickle, no torch (see ``server``)."""

from phalanx.rendezvous.stores.agentstore.auth import NO_TOKEN, Token
from phalanx.rendezvous.stores.agentstore.client import AgentKVStore, TokenRefused
from phalanx.rendezvous.stores.agentstore.server import StoreServer

__all__ = ["NO_TOKEN", "AgentKVStore", "StoreServer", "Token", "TokenRefused"]
