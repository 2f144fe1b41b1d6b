# usage: fail_on_node.py DIR -- on the node whose agent has FAIL_HERE set: wait until the
# healthy rank showed progress this attempt (DIR/beat.<restart>), write DIR/failed, exit 3.
# Elsewhere: with peers, show progress (phalanx.heartbeat) and wait to be stopped; alone,
# succeed once the failing node has failed (before that: wait, a scale-up re-forms it).
import os
import sys
import time
from pathlib import Path

import phalanx

folder = Path(sys.argv[1])
restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
deadline = time.monotonic() + 120
if os.environ.get("FAIL_HERE"):
    while not (folder / f"beat.{restart}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    (folder / "failed").touch()
    print("this node's rank fails", file=sys.stderr, flush=True)
    sys.exit(3)
if int(os.environ["WORLD_SIZE"]) > 1:
    phalanx.heartbeat()
    (folder / f"beat.{restart}").touch()
elif (folder / "failed").exists():
    print("finished without the failing node", flush=True)
    sys.exit(0)
time.sleep(300)
