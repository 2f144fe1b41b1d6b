# usage: hold_until_go.py DIR -- marks DIR/ready<RANK>, waits (at most 120 s) for DIR/go, then
# exits 0 (so a test can look at the job's processes while it runs).
import os
import sys
import time

directory = sys.argv[1]
open(os.path.join(directory, f"ready{os.environ['RANK']}"), "w").close()
deadline = time.monotonic() + 120
while not os.path.exists(os.path.join(directory, "go")) and time.monotonic() < deadline:
    time.sleep(0.05)
