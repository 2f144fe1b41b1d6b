"""One agent store serves one run: its host names the run id, every other node checks it.

The c10d and static stores live in one job's agent, so a second job pointed at the same
endpoint (another ``--rdzv-id``) would otherwise connect, form its own rounds under its own
key prefix, and die when the first job ends and takes the store with it. The host's store
holds its run id under ``RUN_KEY`` before the first connection (``seed``); a node that
connects reads it and refuses to go on under another id, in one line naming both
(``UsageError``: exit 2, the endpoint or the id is to fix). The other job never notices: a
read is all the refused node did. A store that names no run (one no agent hosts, kept up
for several jobs, or an older phalanx's) is not checked.
"""

from __future__ import annotations

import uuid

from phalanx.errors import UsageError
from phalanx.rendezvous.stores.base import KVStore

RUN_KEY = "phalanx/run_id"  # outside every run's own prefix (phalanx/rdzv/<run id>/)
# Which store this is: a fresh id each time an agent serves one. An agent started again on
# the lost store's host serves the same run id at the same place, but not this id
# (``successor``: the survivors never take that empty store for the job's).
STORE_KEY = "phalanx/store_id"


def seed(run_id: str) -> dict[str, bytes]:
    """What the hosting agent's store holds from the start: the run id, and an id of its
    own (``STORE_KEY``)."""
    return {RUN_KEY: run_id.encode(), STORE_KEY: uuid.uuid4().hex.encode()}


def check_store(store: KVStore, run_id: str, where: str) -> None:
    """Raise ``UsageError`` when ``store`` (``where``, in words) serves another run than
    ``run_id``, closing it first. May raise ``StoreUnavailable``, also after closing it."""
    try:
        found = None if store.hosting else store.get(RUN_KEY)
    except BaseException:
        store.close()
        raise
    theirs = run_id if found is None else found.decode("utf-8", "replace")
    if theirs != run_id:
        store.close()
        raise UsageError(
            f"{where} serves run {theirs!r}, not this node's --rdzv-id {run_id!r}: another "
            "job uses this endpoint (give each job its own --rdzv-endpoint port, or this node "
            "the same --rdzv-id to join that job)"
        )
