"""What an agent started again at the lost c10d store's place serves, kept up: a fresh agent
store with the job's token (PHALANX_RDZV_TOKEN, none here) and run id, and an id of its own.

usage: fresh_store.py HOST PORT RUN_ID   prints "serving", then "stopped: REASON" once some
node wrote the job's stop into it; serves until SIGTERM or SIGKILL.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from phalanx.rendezvous.backends.claim import seed
from phalanx.rendezvous.dynamic.board import Board
from phalanx.rendezvous.dynamic.keys import Keys
from phalanx.rendezvous.stores.agentstore import AgentKVStore
from phalanx.rendezvous.stores.agentstore.conf import token_from_conf

host, port, run_id = sys.argv[1], int(sys.argv[2]), sys.argv[3]
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
token = token_from_conf({}, os.environ, [])
store = AgentKVStore.host(host, port, token=token, read_timeout=10.0, seed=seed(run_id), linger=0)
board = Board(store, Keys(run_id), "fresh-store")
print("serving", flush=True)
try:
    while (stopped := board.stopped()) is None:
        time.sleep(0.1)
    print(f"stopped: {stopped[0]}", flush=True)
    while True:
        time.sleep(1.0)
finally:
    store.close()
