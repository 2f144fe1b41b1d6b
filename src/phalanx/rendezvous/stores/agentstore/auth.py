"""The handshake every agent-store connection starts with: mutual challenge-response HMAC.

The server speaks first and reads nothing but the handshake until the peer has proved the
job's token (in frames of at most ``MAX_HANDSHAKE_FRAME`` bytes)::

    server -> client   [GREETING, server_nonce]
    client -> server   [HMAC(key, "client" | server_nonce | client_nonce), client_nonce]
    server -> client   [OK, HMAC(key, "server" | client_nonce | server_nonce)]
                    or [ERROR, why]   (and the server closes)

Both nonces are fresh (``secrets``), so a recorded handshake cannot be replayed, and the two
proofs are labelled differently, so neither side can reflect the other's challenge back. The
client checks the server's proof before it sends a request: a process that holds the port
without the token (an intruder, torch's ``TCPStore``, another job's store) is refused too,
and never learns what this node would have written. Like ``multiprocessing.connection``'s
handshake, with the server proving itself as well.

The key is derived from the token (SHA-256 of a label and the token); without a token both
sides use the key of the empty token, so a job without one still works (every process that
speaks this protocol can join it, as with torchrun), and a node with a token never joins
one without, or the other way round.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass, field

GREETING = b"phalanx-agent-store/1"
NONCE_BYTES = 32
_CLIENT = b"client"
_SERVER = b"server"


@dataclass(frozen=True)
class Token:
    """The job's secret, and where it came from (for messages; the value is never shown)."""

    secret: bytes = field(default=b"", repr=False)
    source: str = ""  # e.g. "PHALANX_RDZV_TOKEN"; "" when there is none

    @property
    def key(self) -> bytes:
        return hashlib.sha256(b"phalanx-rdzv-token\0" + self.secret).digest()

    def __bool__(self) -> bool:
        return bool(self.secret)


NO_TOKEN = Token()


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def client_proof(key: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return hmac.digest(key, _CLIENT + server_nonce + client_nonce, "sha256")


def server_proof(key: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return hmac.digest(key, _SERVER + client_nonce + server_nonce, "sha256")


def proves(expected: bytes, given: bytes) -> bool:
    """Constant-time comparison, so the time taken does not leak how much matched."""
    return hmac.compare_digest(expected, given)
