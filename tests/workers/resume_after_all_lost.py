# usage: resume_after_all_lost.py DIR -- a job whose every member is lost, then resumed.
# Each rank keeps its step in DIR/ckpt.<rank> (written atomically). With none saved it saves
# step 5, says DIR/up.<rank> and waits to be killed; with one it prints where it resumed
# (no torch: the test is about the rendezvous, and each torch import costs 2 s of CPU).
import os
import sys
import time
from pathlib import Path

directory, rank = Path(sys.argv[1]), os.environ["RANK"]
ckpt = directory / f"ckpt.{rank}"
if not ckpt.exists():
    (directory / f"ckpt.{rank}.tmp").write_text("5")
    os.replace(directory / f"ckpt.{rank}.tmp", ckpt)
    (directory / f"pid.{rank}").write_text(str(os.getpid()))
    (directory / f"up.{rank}").touch()
    time.sleep(300)
    sys.exit(1)
restarts, world = os.environ["TORCHELASTIC_RESTART_COUNT"], os.environ["WORLD_SIZE"]
print(f"resumed rank={rank} step={ckpt.read_text()} restart={restarts} world={world}", flush=True)
