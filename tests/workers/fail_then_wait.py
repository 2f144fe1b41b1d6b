# usage: fail_then_wait.py DIR -- the first attempt reports steps 0 and 1 and exits 3; a later
# one reports steps 0..2, marks DIR/running and waits (at most 120 s) for DIR/go, then
# exits 0 (so a test can step a clock in between). No torch.
import os
import sys
import time

import phalanx

if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    phalanx.step(0)
    phalanx.step(1)
    sys.exit(3)
for i in range(3):
    phalanx.step(i)
open(os.path.join(sys.argv[1], "running"), "w").close()
deadline = time.monotonic() + 120
while not os.path.exists(os.path.join(sys.argv[1], "go")) and time.monotonic() < deadline:
    time.sleep(0.05)
