# usage: slow_chatty.py LINES [STATUS] -- prints LINES numbered lines, 20 ms apart, then
# exits with STATUS (default 0).
import sys
import time

for i in range(int(sys.argv[1])):
    print(f"line {i:04d}", flush=True)
    time.sleep(0.02)
sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
