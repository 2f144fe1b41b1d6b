# usage: slow_step_peer.py DIR -- one all-reduce, then (first attempt only) rank 1 goes into a
# long step (sleeps) while rank 0 waits for it in the next all-reduce, its own part sent:
# DIR/r<rank>.waiting marks that moment. On a restart both finish: "ok world=W restart=R".
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, restart = dist.get_rank(), os.environ["TORCHELASTIC_RESTART_COUNT"]
dist.all_reduce(torch.ones(1))
(Path(sys.argv[1]) / f"r{rank}-{restart}.waiting").touch()
if rank == 1 and restart == "0":
    time.sleep(300)  # the long step
dist.all_reduce(torch.ones(1))
print(f"ok world={dist.get_world_size()} restart={restart}", flush=True)
dist.destroy_process_group()
