# usage: finish_unless_rank0.py DIR -- rank 0 waits for DIR/go, the others finish at once;
# every rank writes DIR/ready.RANK first.
import os
import sys
import time

rank = os.environ["RANK"]
open(os.path.join(sys.argv[1], f"ready.{rank}"), "w").close()
while rank == "0" and not os.path.exists(os.path.join(sys.argv[1], "go")):
    time.sleep(0.05)
print(f"done {rank}", flush=True)
