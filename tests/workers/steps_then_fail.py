# usage: steps_then_fail.py STEPS FAIL_RANK FAIL_AT -- STEPS steps reported with
# phalanx.step(i), 0.2 s apart; in the first attempt only, rank FAIL_RANK exits 3 after
# reporting step FAIL_AT. No torch: progress counters are phalanx's own.
import os
import sys
import time

import phalanx

steps, fail_rank, fail_at = (int(a) for a in sys.argv[1:4])
first_attempt = os.environ["TORCHELASTIC_RESTART_COUNT"] == "0"
for i in range(steps):
    phalanx.step(i)
    if first_attempt and int(os.environ["RANK"]) == fail_rank and i == fail_at:
        sys.exit(3)
    time.sleep(0.2)
