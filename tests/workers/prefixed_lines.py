# Prints a plain line, and two lines that already carry the rank as torch writes them: its
# C++ warnings ("[rank0]:[W...") and its excepthook ("[rank0]: ...").
import os

rank = os.environ["RANK"]
print("plain line", flush=True)
print(f"[rank{rank}]:[W1203 07:00:00 ProcessGroupGloo.cpp:1] a torch warning", flush=True)
print(f"[rank{rank}]: Traceback (most recent call last):", flush=True)
