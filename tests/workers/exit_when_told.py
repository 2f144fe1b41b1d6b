# usage: exit_when_told.py DIR -- sleeps until DIR/go exists, then exits 3 (a failure of
# its own, at a moment the test chose).
import os
import sys
import time

while not os.path.exists(os.path.join(sys.argv[1], "go")):
    time.sleep(0.02)
sys.exit(3)
