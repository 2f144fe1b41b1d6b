# usage: raise_when_told.py DIR -- writes its pid to DIR/pid.RANK, then raises its own
# ValueError once DIR/go.first (rank 0) or DIR/go.rest (every other rank) exists. No torch.
import os
import sys
import time

shared, rank = sys.argv[1], os.environ["RANK"]
with open(os.path.join(shared, f"pid.{rank}"), "w") as out:
    out.write(str(os.getpid()))
go = os.path.join(shared, "go.first" if rank == "0" else "go.rest")
deadline = time.monotonic() + 120
while not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.02)
raise ValueError(f"rank {rank} fails on its own")
