# usage: progress_then_slow_stop.py DIR -- for 2 nodes x 2 workers (a node's ranks are
# consecutive). Every attempt: rank 0 makes progress (three phalanx.step beats), then writes
# DIR/shown.<restart> and sleeps; rank 1 (rank 0's node) waits for that file and exits 3, the
# same way every time. On the other node rank 2 sleeps and rank 3 ignores SIGTERM (a rank
# that saves when told to stop), so that node ends its round only after its grace: it
# judges the round last and proposes the verdict first, with no progress of its own. Rank 3
# writes DIR/armed.<restart> once it ignores SIGTERM, and rank 0 waits for it: a rank off rank
# 0's node may start its script up to 1 s late (it waits for rank 0's store to listen).
import os
import signal
import sys
import time
from pathlib import Path

import phalanx

folder, rank = Path(sys.argv[1]), int(os.environ["RANK"])
restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
shown, armed = folder / f"shown.{restart}", folder / f"armed.{restart}"
if rank == 0:
    for n in range(3):
        phalanx.step(n)
    deadline = time.monotonic() + 60
    while not armed.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    shown.touch()
elif rank == 1:
    deadline = time.monotonic() + 60
    while not shown.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    print("rank 1 fails the same way", file=sys.stderr, flush=True)
    sys.exit(3)
elif rank == 3:
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    armed.touch()
time.sleep(300)
