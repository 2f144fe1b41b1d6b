# usage: spare_round.py DIR [go [fail=N]] -- the first attempt says its rank is up (DIR/up.<rank>)
# and waits to be stopped (a member is lost meanwhile); later attempts all-reduce over Gloo
# (rank r gives r+1) and print the sum, and "spare" where the agent has SPARE set. With "go",
# a later attempt first waits (at most 120 s) for DIR/go: its round's workers stay up for as
# long as the test needs (the node check beside them to end, say). With "fail=N", attempt N's
# rank 0 exits 3 at once instead: its round ends while its node check, beside it, still runs.
import os
import sys
import time
from pathlib import Path

if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    (Path(sys.argv[1]) / f"up.{os.environ['RANK']}").touch()
    time.sleep(300)
    sys.exit(1)
if os.environ["RANK"] == "0" and f"fail={os.environ['TORCHELASTIC_RESTART_COUNT']}" in sys.argv:
    sys.exit(3)

import torch
import torch.distributed as dist

deadline = time.monotonic() + 120
while sys.argv[2:3] == ["go"] and not (Path(sys.argv[1]) / "go").exists():
    if time.monotonic() > deadline:
        break
    time.sleep(0.05)

dist.init_process_group("gloo")
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
who = " spare" if os.environ.get("SPARE") else ""
print(f"sum={int(value.item())} world={dist.get_world_size()}{who}", flush=True)
dist.destroy_process_group()
