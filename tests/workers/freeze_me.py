# usage: freeze_me.py DIR -- rank 1 writes DIR/victim.pid and sleeps (the test freezes it);
# rank 0 waits for DIR/go, then exits 3, so phalanx has to stop rank 1.
import os
import sys
import time

folder = sys.argv[1]
if os.environ["RANK"] == "1":
    with open(os.path.join(folder, "victim.tmp"), "w") as handle:
        handle.write(str(os.getpid()))
    os.replace(os.path.join(folder, "victim.tmp"), os.path.join(folder, "victim.pid"))
    time.sleep(300)
deadline = time.monotonic() + 120
while not os.path.exists(os.path.join(folder, "go")) and time.monotonic() < deadline:
    time.sleep(0.05)
sys.exit(3)
