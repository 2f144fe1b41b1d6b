# usage: step_then_wait.py DIR [go] -- reports step 0 (phalanx.step), marks DIR/ready, then sleeps
# without progress until phalanx stops it (a hang, once --stall-timeout has passed).
# "go": it goes on stepping (every 0.1 s) until DIR/go exists, so the hang's clock starts
# once the test made its fault, whatever the load, rather than at step 0.
import sys
import time
from pathlib import Path

import phalanx

folder = Path(sys.argv[1])
phalanx.step(0)
(folder / "ready").touch()
step = 1
while len(sys.argv) > 2 and not (folder / "go").exists():
    phalanx.step(step)
    step += 1
    time.sleep(0.1)
time.sleep(300)
