# usage: wait_then_fail.py DIR -- marks DIR/ready, waits (at most 120 s) for DIR/go, then
# exits 3 (so the launcher writes its failure report).
import os
import sys
import time

directory = sys.argv[1]
open(os.path.join(directory, "ready"), "w").close()
deadline = time.monotonic() + 120
while not os.path.exists(os.path.join(directory, "go")) and time.monotonic() < deadline:
    time.sleep(0.05)
sys.exit(3)
