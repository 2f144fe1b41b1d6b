# usage: step_then_wait.py DIR -- reports step 0 (phalanx.step), marks DIR/ready, then sleeps
# without progress until phalanx stops it (a hang, once --stall-timeout has passed).
import sys
import time
from pathlib import Path

import phalanx

phalanx.step(0)
(Path(sys.argv[1]) / "ready").touch()
time.sleep(300)
