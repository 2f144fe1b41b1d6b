# Needs no peer and finishes at once: prints its world size, the job's restart count and its
# rank, one line, and exits 0.
import os

world, restart = os.environ["WORLD_SIZE"], os.environ["TORCHELASTIC_RESTART_COUNT"]
print(f"world={world} restart={restart} rank={os.environ['RANK']}", flush=True)
