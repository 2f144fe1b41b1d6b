# usage: steps_slowly.py STEPS -- STEPS steps reported with phalanx.step(i), 0.2 s apart,
# each also printed as "rank R step i" (its own log lines, for phalanx logs). No torch.
import os
import sys
import time

import phalanx

rank = os.environ["RANK"]
for i in range(int(sys.argv[1])):
    phalanx.step(i)
    print(f"rank {rank} step {i}", flush=True)
    time.sleep(0.2)
