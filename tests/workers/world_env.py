# usage: world_env.py OUT_DIR -- joins the Gloo world, all-reduces rank+1, and writes this
# worker's environment and what the world said to OUT_DIR/rank_<RANK>.json.
import json
import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
seen = {"rank": dist.get_rank(), "world": dist.get_world_size(), "sum": value.item()}
with open(os.path.join(sys.argv[1], f"rank_{dist.get_rank()}.json"), "w") as handle:
    json.dump({"seen": seen, "env": dict(os.environ)}, handle)
dist.destroy_process_group()
