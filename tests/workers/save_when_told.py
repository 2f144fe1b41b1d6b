# usage: save_when_told.py DIR -- marks DIR/ready, waits (at most 120 s) for DIR/go, then
# saves {"step": 1} with phalanx.checkpoint into DIR/ckpt and exits 0 (so a test can break
# the run directory between the start and the save).
import sys
import time
from pathlib import Path

from phalanx import checkpoint

folder = Path(sys.argv[1])
(folder / "ready").touch()
deadline = time.monotonic() + 120
while not (folder / "go").exists() and time.monotonic() < deadline:
    time.sleep(0.05)
checkpoint.save({"step": 1}, folder / "ckpt", step=1)
print("saved step 1", flush=True)
