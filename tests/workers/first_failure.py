# usage: first_failure.py DIR -- rank 0 exits 7 once DIR/go exists; rank 1 waits in an
# all_reduce rank 0 never joins, so it fails only after rank 0 died, by Gloo's word for it
# (the peer closed the connection). Both write DIR/ready.RANK (rank 1's holds its pid) once
# the group has met.
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

shared, rank = Path(sys.argv[1]), int(os.environ["RANK"])
dist.init_process_group("gloo")
dist.all_reduce(torch.ones(1))  # both ranks are connected
(shared / f".ready.{rank}").write_text(str(os.getpid()))
(shared / f".ready.{rank}").rename(shared / f"ready.{rank}")  # whole or absent: the test reads it
if rank == 0:
    while not (shared / "go").exists():
        time.sleep(0.05)
    print("rank 0 fails first, on purpose", file=sys.stderr, flush=True)
    os._exit(7)  # no interpreter teardown: nothing of torch's exit path can change the code
dist.all_reduce(torch.ones(1))
