# usage: fail_once_here.py DIR -- every rank marks DIR/up.<restart>.<rank>. On the node whose
# agent has FAIL_HERE set, the first attempt's rank exits 3 once every rank is up and DIR/go
# exists (the test's word). Every other rank, and every rank of a later attempt, waits to be
# stopped. No torch.
import os
import sys
import time
from pathlib import Path

folder = Path(sys.argv[1])
restart, rank = os.environ["TORCHELASTIC_RESTART_COUNT"], os.environ["RANK"]
(folder / f"up.{restart}.{rank}").touch()
if restart == "0" and os.environ.get("FAIL_HERE"):
    deadline = time.monotonic() + 120
    world = int(os.environ["WORLD_SIZE"])
    while len(list(folder.glob("up.0.*"))) < world or not (folder / "go").exists():
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    print("this node's rank fails", file=sys.stderr, flush=True)
    sys.exit(3)
time.sleep(300)
