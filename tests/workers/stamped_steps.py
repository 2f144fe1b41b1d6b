# usage: stamped_steps.py DIR STEPS FAIL_AT -- steps 0..STEPS-1 reported with phalanx.step(i),
# 0.3 s apart, each stamped "STEP MONOTONIC" in DIR/r<rank>-<restart>.stamps (the host's
# monotonic clock: the agent's events' "mono" too). In the first attempt both ranks stop at
# step FAIL_AT: rank 1 exits 3 once rank 0 has stamped it too (under load rank 0 may start
# late: stopped before that stamp, it left the test no step FAIL_AT to time the incident
# from), the others wait to be stopped. No torch.
import os
import sys
import time

import phalanx

out, steps, fail_at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rank, restart = int(os.environ["RANK"]), os.environ["TORCHELASTIC_RESTART_COUNT"]
with open(os.path.join(out, f"r{rank}-{restart}.stamps"), "w") as stamps:
    time.sleep(0.2)
    for i in range(steps):
        phalanx.step(i)
        stamps.write(f"{i} {time.monotonic()}\n")
        stamps.flush()
        if restart == "0" and i == fail_at:
            if rank == 1:
                first = os.path.join(out, f"r0-{restart}.stamps")
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    if os.path.exists(first):
                        with open(first) as theirs:
                            if any(line.split()[:1] == [str(i)] for line in theirs):
                                break
                    time.sleep(0.01)
                sys.exit(3)
            time.sleep(60)  # stopped by phalanx once rank 1 failed
        time.sleep(0.3)
