"""One agent store serves one run: the store's host names its run id, every other node checks it.

The c10d and static stores live in one job's agent, so a second job pointed at the same
endpoint (another ``--rdzv-id``) would otherwise connect, form its own rounds under its own
key prefix, and die when the first job ends and takes the store with it. The host writes its
run id under ``RUN_KEY`` before any round; a node that connects reads it (waiting at most
``read_timeout`` for a host that has just started) and refuses to go on under another id,
in one line naming both (``UsageError``: exit 2, the endpoint or the id is to fix). The
other job never notices: a read is all the refused node did.
"""

from __future__ import annotations

from phalanx.errors import UsageError
from phalanx.rendezvous.stores.base import KVStore

RUN_KEY = "phalanx/run_id"  # outside every run's own prefix (phalanx/rdzv/<run id>/)


def claim_store(store: KVStore, run_id: str, wait: float, where: str) -> None:
    """Name ``run_id`` as the store's run (the host), or check that it is (everyone else;
    ``where``: the store, in words). Closes ``store`` when it raises."""
    try:
        _claim(store, run_id, wait, where)
    except BaseException:
        store.close()
        raise


def _claim(store: KVStore, run_id: str, wait: float, where: str) -> None:
    if store.hosting:
        store.set(RUN_KEY, run_id.encode())
        return
    found = store.get(RUN_KEY)
    if found is None and store.wait([RUN_KEY], wait):
        found = store.get(RUN_KEY)
    if found is None:
        return  # a host that names no run (an older phalanx): nothing to compare
    theirs = found.decode("utf-8", "replace")
    if theirs != run_id:
        raise UsageError(
            f"{where} serves run {theirs!r}, not this "
            f"node's --rdzv-id {run_id!r}: another job uses this endpoint (give each job its "
            "own --rdzv-endpoint port, or this node the same --rdzv-id to join that job)"
        )
