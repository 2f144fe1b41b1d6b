# usage: laststep_then_sleep.py DIR -- holds a LastStep (step 7) of checkpoint directory DIR,
# then sleeps (a hang) until phalanx stops it; the agent's stop asks it for its last step.
import sys
import time

import torch

from phalanx import checkpoint

last = checkpoint.LastStep(sys.argv[1])
last.update(7, {"w": torch.ones(2)})
with last:
    time.sleep(3600)  # the hang
