# usage: chatty_until_go.py DIR -- prints a numbered line every 20 ms until DIR/go exists
# (at most 120 s), then "done", and exits 0: output before and after a moment the test picks.
import os
import sys
import time

deadline = time.monotonic() + 120
n = 0
while not os.path.exists(os.path.join(sys.argv[1], "go")) and time.monotonic() < deadline:
    print(f"line {n:05d}", flush=True)
    n += 1
    time.sleep(0.02)
print("done", flush=True)
