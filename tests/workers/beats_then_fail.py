# usage: beats_then_fail.py BEATS -- no step reported, only phalanx.heartbeat() (beats): the
# first attempt beats BEATS times and exits 3; a later one beats twice and exits 0, as a
# script resumed from a checkpoint does (its beats count from 0 again). No torch.
import os
import sys

import phalanx

first = os.environ["TORCHELASTIC_RESTART_COUNT"] == "0"
for _ in range(int(sys.argv[1]) if first else 2):
    phalanx.heartbeat()
sys.exit(3 if first else 0)
