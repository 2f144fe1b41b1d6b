# usage: preempt_listen.py OUT_DIR [fail] -- no process group: installs its own SIGUSR1
# handler (after phalanx's boot), starts a child (a data loader's stand-in) that notes any
# SIGUSR1 in OUT_DIR/child_got_signal, writes OUT_DIR/up_rank<R>, then asks
# phalanx.preempted() until True. Writes OUT_DIR/rank<R>.json with what it saw (the notice,
# its own handler's signal) and exits 0 -- or 3 with "fail", a real failure during the grace.
import json
import os
import signal
import subprocess
import sys
import time

import phalanx

CHILD = """
import os, signal, sys, time
out = sys.argv[1]
signal.signal(signal.SIGUSR1, lambda s, f: open(os.path.join(out, "child_got_signal"), "w").close())
open(os.path.join(out, "child_up_" + os.environ["RANK"]), "w").close()
time.sleep(120)
"""

out, rank = sys.argv[1], os.environ["RANK"]
got: list[int] = []
signal.signal(signal.SIGUSR1, lambda signum, frame: got.append(signum))
child = subprocess.Popen([sys.executable, "-c", CHILD, out])
while not os.path.exists(os.path.join(out, f"child_up_{rank}")):
    time.sleep(0.02)
open(os.path.join(out, f"up_rank{rank}"), "w").close()
deadline = time.monotonic() + 120
while not phalanx.preempted() and time.monotonic() < deadline:
    time.sleep(0.05)
noticed = phalanx.preempted()
while not got and time.monotonic() < deadline:
    time.sleep(0.05)  # the signal follows the notice
child.kill()
child.wait()
with open(os.path.join(out, f"rank{rank}.json"), "w") as handle:
    json.dump({"noticed": noticed, "signals": got}, handle)
sys.exit(3 if sys.argv[2:] == ["fail"] else 0)
