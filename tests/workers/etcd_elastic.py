# usage: etcd_elastic.py DIR TAG -- joins Gloo and all-reduces, then records what it saw in
# DIR/TAG-<restart>.json. On the first attempt it then sleeps (waiting to be stopped); on a
# restart it prints its world and exits 0.
import json
import os
import sys
import time

import torch
import torch.distributed as dist

directory, tag = sys.argv[1], sys.argv[2]
restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
dist.init_process_group("gloo")
value = torch.tensor([1.0])
dist.all_reduce(value)
seen = {
    "pid": os.getpid(),
    "node": int(os.environ["GROUP_RANK"]),
    "world": int(value.item()),
    "master_port": int(os.environ["MASTER_PORT"]),
}
path = os.path.join(directory, f"{tag}-{restart}.json")
with open(path + ".tmp", "w") as handle:
    json.dump(seen, handle)
os.replace(path + ".tmp", path)
if restart == "0":
    time.sleep(300)
print(f"world={seen['world']} restart={restart} node={seen['node']}", flush=True)
dist.destroy_process_group()
