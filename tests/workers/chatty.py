# usage: chatty.py KIB [fail|fail-once] -- writes KIB KiB to stdout in numbered lines (and a
# little to stderr), then exits 0, or raises with "fail" (the traceback is the stream's last
# words); "fail-once" raises in the first attempt only (TORCHELASTIC_RESTART_COUNT 0).
import os
import sys

kib = int(sys.argv[1])
for i in range(kib):
    print(f"line {i:06d} " + "x" * 1000, flush=True)
print("chatty wrote everything", file=sys.stderr, flush=True)
how = sys.argv[2] if len(sys.argv) > 2 else ""
if how == "fail" or (how == "fail-once" and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0"):
    raise RuntimeError("chatty failed after filling the disk")
