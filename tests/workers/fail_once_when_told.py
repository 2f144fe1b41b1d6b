# usage: fail_once_when_told.py DIR -- marks DIR/ready.<GROUP_RANK>.<restart>; on the first
# attempt waits (at most 120 s) for DIR/go, then node 0's rank exits 3 and the others wait
# to be stopped; on a restart every rank prints its world and exits 0 at once.
import os
import sys
import time

directory, node = sys.argv[1], os.environ["GROUP_RANK"]
restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
open(os.path.join(directory, f"ready.{node}.{restart}"), "w").close()
if restart == "0":
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(directory, "go")) and time.monotonic() < deadline:
        time.sleep(0.05)
    if node == "0":
        print("node 0's rank fails on purpose", file=sys.stderr, flush=True)
        sys.exit(3)
    time.sleep(120)
print(f"world={os.environ['WORLD_SIZE']} restart={restart}", flush=True)
