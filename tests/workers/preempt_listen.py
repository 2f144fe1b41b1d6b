# usage: preempt_listen.py OUT_DIR [fail] -- no process group: installs its own SIGUSR1
# handler (after phalanx's boot), writes OUT_DIR/up_rank<R>, then asks phalanx.preempted()
# until True. Writes OUT_DIR/rank<R>.json with what it saw (the notice, its own handler's
# signal) and exits 0 -- or 3 with "fail", a real failure during the grace.
import json
import os
import signal
import sys
import time

import phalanx

out, rank = sys.argv[1], os.environ["RANK"]
got: list[int] = []
signal.signal(signal.SIGUSR1, lambda signum, frame: got.append(signum))
open(os.path.join(out, f"up_rank{rank}"), "w").close()
deadline = time.monotonic() + 120
while not phalanx.preempted() and time.monotonic() < deadline:
    time.sleep(0.05)
noticed = phalanx.preempted()
while not got and time.monotonic() < deadline:
    time.sleep(0.05)  # the signal follows the notice
with open(os.path.join(out, f"rank{rank}.json"), "w") as handle:
    json.dump({"noticed": noticed, "signals": got}, handle)
sys.exit(3 if sys.argv[2:] == ["fail"] else 0)
