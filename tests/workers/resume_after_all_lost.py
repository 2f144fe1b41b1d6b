# usage: resume_after_all_lost.py DIR -- a job whose every member is lost, then resumed.
# Each rank keeps its step in DIR/ckpt.<rank> (written atomically). With none saved, or
# before any restart (a late node's re-form runs the first attempt again: under load round 0
# may form without it), it saves step 5, says DIR/up.<rank> and waits to be killed; after a
# restart it prints where it resumed (no torch: the test is about the rendezvous, and each
# torch import costs 2 s of CPU).
import os
import sys
import time
from pathlib import Path

directory, rank = Path(sys.argv[1]), os.environ["RANK"]
ckpt = directory / f"ckpt.{rank}"
restarts, world = os.environ["TORCHELASTIC_RESTART_COUNT"], os.environ["WORLD_SIZE"]
if not ckpt.exists() or restarts == "0":
    (directory / f"ckpt.{rank}.tmp").write_text("5")
    os.replace(directory / f"ckpt.{rank}.tmp", ckpt)
    (directory / f"pid.{rank}").write_text(str(os.getpid()))
    (directory / f"up.{rank}").touch()
    time.sleep(300)
    sys.exit(1)
print(f"resumed rank={rank} step={ckpt.read_text()} restart={restarts} world={world}", flush=True)
