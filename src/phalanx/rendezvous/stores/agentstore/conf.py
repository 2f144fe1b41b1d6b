"""Where the agent store's token comes from (c10d and static), and what is said without one.

The token is read from the file named by ``--rdzv-conf token_file=PATH`` (one trailing
newline dropped, as ``echo secret > file`` writes it) or, failing that, from the environment
variable ``PHALANX_RDZV_TOKEN``. It is never taken from the command line: ``--rdzv-conf
token=...`` is refused, because ``ps`` and shell history would show it. Messages name the
key or the variable, never the value; the workers never get it (``phalanx.rendezvous.credentials``).

Without a token the store still works (torchrun's behaviour: anyone who reaches the port can
join); the agent says so once at start, on loopback too (any local process reaches that).
``--hosts``/``--hostfile`` makes a token per job and sends it to every agent it starts
(``phalanx.hosts``); one-node jobs have no store at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from phalanx.rendezvous.credentials import RDZV_TOKEN_ENV

if TYPE_CHECKING:  # auth (hashlib, hmac, secrets) where a token is read: a one-node job reads
    from phalanx.rendezvous.stores.agentstore.auth import Token  # its keys here, never a token

TOKEN_FILE_KEY = "token_file"
CONF_KEYS = frozenset({TOKEN_FILE_KEY, "token"})  # "token" is known only to be refused
# c10d's --rdzv-conf keys (static's are CONF_KEYS): here, not in its backend, so that a one-node
# job checks them without importing the store and the dynamic rendezvous (``registry.KEYS``)
C10D_KEYS = frozenset({"is_host", "store_type"}) | CONF_KEYS
HOW_TO_SET = f"set the same {RDZV_TOKEN_ENV} or --rdzv-conf token_file=PATH on every node"


def token_from_conf(
    conf: Mapping[str, str], environ: Mapping[str, str], problems: list[str]
) -> Token:
    """The job's token (``NO_TOKEN`` when none is set); problems appended to ``problems``."""
    from phalanx.rendezvous.stores.agentstore.auth import NO_TOKEN, Token

    if "token" in conf:
        problems.append(
            "--rdzv-conf token: the rendezvous token is never given on the command line (ps "
            f"and shell history show it); set {RDZV_TOKEN_ENV} or put it in a file and pass "
            "--rdzv-conf token_file=PATH"
        )
        return NO_TOKEN
    path = conf.get(TOKEN_FILE_KEY)
    if path is None:
        value = environ.get(RDZV_TOKEN_ENV, "")
        return Token(value.encode("utf-8"), RDZV_TOKEN_ENV) if value else NO_TOKEN
    where = f"--rdzv-conf token_file={path}"
    try:
        with open(path, "rb") as handle:
            secret = handle.read()
    except OSError as exc:
        problems.append(f"{where}: cannot read it ({exc.strerror or exc.__class__.__name__})")
        return NO_TOKEN
    secret = secret.removesuffix(b"\n").removesuffix(b"\r")
    if not secret:
        problems.append(f"{where}: the file is empty")
        return NO_TOKEN
    return Token(secret, "--rdzv-conf token_file")


def no_token_warning(token: Token, what: str) -> str | None:
    """The line to log once at start when the store ``what`` has no token (None with one).
    Loopback is no exception: a local process took node rank 0, and with it the workers'
    master address, of a job on 127.0.0.1."""
    if token:
        return None
    return (
        f"rendezvous: {what} has no token, so any process that can reach it (on this machine "
        f"too) can join, take node rank 0, steer or stop this job; {HOW_TO_SET} "
        "(--hosts/--hostfile make one per job)"
    )
