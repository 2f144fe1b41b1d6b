# usage: hold_until_go.py DIR [FAILING_RANK] -- marks DIR/ready<RANK>, waits (at most 120 s)
# for DIR/go, then exits 0, or 3 on FAILING_RANK (so a test can look at the job's processes
# while it runs, and then have a failure report written).
import os
import sys
import time

directory = sys.argv[1]
rank = os.environ["RANK"]
open(os.path.join(directory, f"ready{rank}"), "w").close()
deadline = time.monotonic() + 120
while not os.path.exists(os.path.join(directory, "go")) and time.monotonic() < deadline:
    time.sleep(0.05)
sys.exit(3 if sys.argv[2:] == [rank] else 0)
