# usage: port_rounds.py OUT_DIR -- writes MASTER_PORT to OUT_DIR/port_<RANK>_<RESTART>; rank 1
# exits 5 on the first attempt before joining Gloo (a restart follows under --max-restarts);
# every other attempt joins the world on that port and writes OUT_DIR/sum_<RANK>_<RESTART>.
import os
import sys

import torch
import torch.distributed as dist

rank, restart = os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"]
with open(os.path.join(sys.argv[1], f"port_{rank}_{restart}"), "w") as handle:
    handle.write(os.environ["MASTER_PORT"])
if rank == "1" and restart == "0":
    sys.exit(5)
dist.init_process_group("gloo")
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
with open(os.path.join(sys.argv[1], f"sum_{rank}_{restart}"), "w") as handle:
    handle.write(str(int(value.item())))
dist.destroy_process_group()
