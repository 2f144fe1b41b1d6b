# usage: beat_then_spin.py SECONDS -- three phalanx.step() beats, then a busy loop (its main
# thread's CPU time grows, its progress does not) for SECONDS, then exit 0. No torch.
import sys
import time

import phalanx

for i in range(3):
    phalanx.step(i)
print("stepped", flush=True)
deadline = time.monotonic() + float(sys.argv[1])
while time.monotonic() < deadline:  # busy, as a rank spinning in a wait can be
    pass
print("spun to the end", flush=True)
