"""The guardian readies its last word while the agent lives (``lastword.ready``): at the
agent's death the word costs one request, not the imports of phalanx and the store's client
(under load those imports took 0.2-2.7 s of an agent SIGKILL's detection on etcd).

Tier (c): a real guardian of a stand-in agent, a real etcd. The word names a copy of
phalanx's sources as the guardian's import path; once the guardian has imported the etcd
client (its ``_ssl`` extension is mapped) and its readying thread has ended, the copy is
removed and the agent SIGKILLed: the guardian can say the word only with what it imported
before. The same request deletes the dead agent's receipt key."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import phalanx
from phalanx.rendezvous import lastword
from phalanx.rendezvous.dynamic.board import DIED
from phalanx.rendezvous.dynamic.keys import Keys
from phalanx.rendezvous.stores.etcd.conf import EtcdOptions, run_prefix
from phalanx.rendezvous.stores.etcd.store import EtcdStore
from support.etcd_server import EtcdCluster
from support.launch import alive, wait_for, worker
from support.tools import needs_etcd

RUN_ID = "lastword-ready"
HANG = 60.0


@pytest.fixture
def etcd() -> Iterator[EtcdCluster]:
    with EtcdCluster(size=1) as cluster:
        yield cluster


def _readied(guardian: int) -> bool:
    """The guardian imported the etcd client (``_ssl`` mapped: only the client needs it) and
    its readying thread ended (one thread left)."""
    maps = Path(f"/proc/{guardian}/maps").read_text()
    return "/_ssl." in maps and len(list(Path(f"/proc/{guardian}/task").iterdir())) == 1


@needs_etcd
def test_the_guardian_says_the_word_with_what_it_imported_before_the_death(
    etcd: EtcdCluster, tmp_path: Path
) -> None:
    source = Path(phalanx.__file__).parent
    copy = tmp_path / "copy"
    shutil.copytree(source, copy / "phalanx", ignore=shutil.ignore_patterns("__pycache__"))
    # The dead agent's handle, with a receipt written (a conditional write).
    agent_store = EtcdStore(etcd.endpoints, run_prefix(RUN_ID), EtcdOptions())
    try:
        agent_store.add("counter", 1)
        receipt = agent_store.receipt
        assert etcd.value(receipt) is not None
        reach = lastword.etcd(etcd.endpoints, EtcdOptions(), receipt)
        said = lastword.word(reach, RUN_ID, "node-b")
        # Its import path: the copy, and none of the other places phalanx could come from.
        said["path"] = [str(copy), *(p for p in said["path"] if not (Path(p) / "phalanx").exists())]
        proc = subprocess.Popen(
            [sys.executable, worker("guardian_agent.py"), json.dumps(said)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert proc.stdout is not None
            guardian = int(proc.stdout.readline())
            wait_for(lambda: _readied(guardian), HANG, "the guardian to ready its word")
            shutil.rmtree(copy)  # nothing of phalanx left to import from
            proc.kill()
            proc.wait(10)
            wait_for(lambda: not alive(guardian), HANG, "the guardian to say its word and exit")
        finally:
            proc.kill()
            proc.wait(10)
        heartbeat = run_prefix(RUN_ID) + "kv/" + Keys(RUN_ID).heartbeat("node-b")
        assert etcd.value(heartbeat) == DIED
        assert etcd.value(receipt) is None  # gone with the word: no lease would remove it
    finally:
        agent_store.close()
