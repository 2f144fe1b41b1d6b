# Rank 1 raises; rank 0 sleeps until stopped.
import os
import time

if os.environ["RANK"] == "1":
    raise ValueError("bad learning rate 1e9")
time.sleep(300)
