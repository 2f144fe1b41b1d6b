"""The last word: what a dead agent's guardian tells the job, so it is not waited for.

An agent that dies without leaving (SIGKILL, the OOM killer, a segfault) writes nothing
more; the other nodes would count it lost only when its liveness runs out --
``heartbeat_timeout`` (counters: c10d, static) or ``lease_ttl`` (etcd) -- and the whole job
idles until then. Its guardian (``phalanx.supervisor.guardian``) outlives it by design and
sees it die at once (EOF on its pipe without the goodbye line). Given the *word* -- how a
fresh process reaches the rendezvous store as a client, and which node this is -- the
guardian writes ``DIED`` into the node's liveness key (``say_died``) and the watchers count
the node lost on their next look (``pulse``).

A word is plain JSON data, so it travels over the guardian's private pipe. It carries the
store's credentials (the agent store's token, etcd's password): never the guardian's
environment, which is the workers' (``phalanx.rendezvous.credentials``).

Only a store this node does not host has a word: a c10d or static store lives in its
hosting agent, so when that agent dies the store dies with it, and the others learn that
from the store itself. ``say_died`` opens the store as a client only, never hosts it.

On etcd the same request deletes the dead agent's receipt key (``EtcdStore.set_dropping``),
which no lease removes. ``ready`` imports what ``say_died`` needs, for the guardian to call
while the agent lives: the word then costs one request at the agent's death.

Every step of ``say_died`` is bounded (``SAY_TIMEOUT`` per connection and request) and no
error escapes it: the guardian has its cleanup to finish. A try that failed at once (a
refused or reset connection, a reply that is not the store's) is made once more, when a
whole second try still ends before the guardian's deadline; one that took its timeout is
not (a second would not). A word that could not be said leaves the old behaviour, the
others count the node lost when its lease or heartbeats run out, and the guardian says so
on its stderr, which is the agent's: the node's log (``guardian: could not tell ...``).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # imported where used: the guardian imports this module and nothing more
    from phalanx.rendezvous.stores.agentstore.auth import Token
    from phalanx.rendezvous.stores.etcd.conf import EtcdOptions

Word = dict[str, Any]  # JSON-able
Reach = dict[str, Any]  # how a fresh process opens the store as a client: part of a word

SAY_TIMEOUT = 2.0  # seconds per connection and per request
_TRY = 2 * SAY_TIMEOUT  # the longest one try takes (the agent store: connect, then set)
_PAUSE = 0.1  # s before the second try: a store restarting, a leader changing

log = logging.getLogger("phalanx")


def agent_store(host: str, port: int, token: Token) -> Reach:
    """How to reach the agent store (c10d, static) at ``host:port`` with ``token``."""
    return {"store": "agent", "host": host, "port": port, "token": token.secret.hex()}


def etcd(endpoints: Sequence[str], options: EtcdOptions, receipt: str = "") -> Reach:
    """How to reach etcd at ``endpoints`` (base URLs) with ``options``; ``receipt``: the
    agent's receipt key (``EtcdStore.receipt``), deleted with the word (nobody else would)."""
    return {
        "store": "etcd", "endpoints": list(endpoints), "options": asdict(options),
        "receipt": receipt,
    }  # fmt: skip


def word(reach: Mapping[str, Any], run_id: str, node_id: str) -> Word:
    """What the guardian needs to say that node ``node_id`` of run ``run_id`` died: the
    store's ``reach``, and this interpreter's import path (the guardian runs with ``-I -S``:
    no site packages; it puts these after its standard library), phalanx's own directory
    first."""
    here = str(Path(__file__).resolve().parents[2])  # the directory holding ``phalanx``
    return {
        "path": [here, *(p for p in sys.path if p != here)],
        "reach": dict(reach),
        "run_id": run_id,
        "node_id": node_id,
    }


def ready(word: Mapping[str, Any]) -> None:
    """Import now everything ``say_died(word)`` will need, so that saying it costs a request,
    not the imports: the guardian calls this as soon as it is given the word, while the
    agent lives (the etcd client's imports took most of the 0.8-1.2 s from an agent's
    SIGKILL to its ``DIED``). Never raises: ``say_died`` imports what is missing."""
    with contextlib.suppress(Exception):
        from phalanx.rendezvous.dynamic import board, keys  # noqa: F401

        _SAYERS[word["reach"]["store"]].ready()


def say_died(word: Mapping[str, Any], until: float) -> None:
    """Write ``DIED`` into the liveness key of the word's node, as a client of its store;
    a second try only if it ends before ``until`` (``time.monotonic()``). Never raises; a
    word not said is logged (the module's docstring)."""
    with contextlib.suppress(Exception):
        tries, why = 0, ""
        while True:
            tries += 1
            began = time.monotonic()
            try:
                _say(word)
                return
            except Exception as exc:  # any: the word's own fault too (a module not found)
                why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            if tries > 1 or time.monotonic() - began >= SAY_TIMEOUT:
                break
            if time.monotonic() + _PAUSE + _TRY > until:
                break
            time.sleep(_PAUSE)
        _not_said(word, why, tries)


def _say(word: Mapping[str, Any]) -> None:
    from phalanx.rendezvous.dynamic.keys import Keys

    reach = word["reach"]
    _SAYERS[reach["store"]].say(
        reach, word["run_id"], Keys(word["run_id"]).heartbeat(word["node_id"])
    )


def _not_said(word: Mapping[str, Any], why: str, tries: int) -> None:
    if not log.handlers:  # the guardian: nothing set up; its stderr is the agent's
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("phalanx: %(message)s"))
        log.addHandler(handler)
    etcd = word["reach"].get("store") == "etcd"
    log.warning(
        "guardian: could not tell the rendezvous store that this node's agent died (%s; "
        "%d %s): the other nodes count the node lost only when its %s",
        why, tries, "try" if tries == 1 else "tries",
        "lease runs out (lease_ttl)" if etcd else "heartbeats are heartbeat_timeout old",
    )  # fmt: skip


class _AgentStore:
    @staticmethod
    def ready() -> None:
        from phalanx.rendezvous.stores.agentstore import AgentKVStore  # noqa: F401

    @staticmethod
    def say(reach: Mapping[str, Any], run_id: str, key: str) -> None:
        from phalanx.rendezvous.dynamic.board import DIED
        from phalanx.rendezvous.stores.agentstore import AgentKVStore
        from phalanx.rendezvous.stores.agentstore.auth import Token

        token = Token(bytes.fromhex(reach["token"]))
        # Connects on first use, once: no retries until a join timeout, as an agent would.
        store = AgentKVStore(reach["host"], reach["port"], token, read_timeout=SAY_TIMEOUT)
        try:
            store.set(key, DIED)
        finally:
            store.close()


class _Etcd:
    @staticmethod
    def ready() -> None:
        from phalanx.rendezvous.stores.etcd import conf, store  # noqa: F401

    @staticmethod
    def say(reach: Mapping[str, Any], run_id: str, key: str) -> None:
        from phalanx.rendezvous.dynamic.board import DIED
        from phalanx.rendezvous.stores.etcd.conf import EtcdOptions, run_prefix
        from phalanx.rendezvous.stores.etcd.store import EtcdStore

        options = replace(EtcdOptions(**reach["options"]), request_timeout=SAY_TIMEOUT)
        store = EtcdStore(reach["endpoints"], run_prefix(run_id), options)
        try:
            # A plain put grants no lease, and takes the key off the dead agent's; the dead
            # agent's receipt goes in the same request (no lease would remove it).
            store.set_dropping(key, DIED, reach.get("receipt", ""))
        finally:
            store.close()


class _Sayer(Protocol):
    def ready(self) -> None: ...

    def say(self, reach: Mapping[str, Any], run_id: str, key: str) -> None: ...


_SAYERS: dict[str, _Sayer] = {"agent": _AgentStore(), "etcd": _Etcd()}
