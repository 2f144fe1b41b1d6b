# usage: beat_then_fail_when_told.py DIR LAST -- every attempt, each rank beats once
# (phalanx.heartbeat: progress, so the same failure again is no crash loop) and writes
# DIR/up.<restart>.<rank>, then waits for DIR/go.<restart> and exits 3; attempt LAST exits 0.
# No torch.
import os
import sys
import time

import phalanx

shared, last = sys.argv[1], int(sys.argv[2])
restart, rank = os.environ["TORCHELASTIC_RESTART_COUNT"], os.environ["RANK"]
phalanx.heartbeat()
with open(os.path.join(shared, f"up.{restart}.{rank}"), "w") as out:
    out.write(str(os.getpid()))
deadline = time.monotonic() + 120
while not os.path.exists(os.path.join(shared, f"go.{restart}")) and time.monotonic() < deadline:
    time.sleep(0.02)
sys.exit(0 if int(restart) == last else 3)
