# usage: chatty.py KIB [fail] -- writes KIB KiB to stdout in numbered lines (and a little to
# stderr), then exits 0, or raises with "fail" (the traceback is the stream's last words).
import sys

kib = int(sys.argv[1])
for i in range(kib):
    print(f"line {i:06d} " + "x" * 1000, flush=True)
print("chatty wrote everything", file=sys.stderr, flush=True)
if len(sys.argv) > 2 and sys.argv[2] == "fail":
    raise RuntimeError("chatty failed after filling the disk")
