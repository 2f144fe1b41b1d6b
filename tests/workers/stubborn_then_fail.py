# usage: stubborn_then_fail.py DIR STUBBORN_RANK -- STUBBORN_RANK ignores SIGTERM (noting each
# one in DIR/sigterm), writes DIR/stubborn.pid and sleeps; every other rank waits for that
# file, then exits 3.
import os
import signal
import sys
import time

directory, stubborn = sys.argv[1], sys.argv[2]
pid_file = os.path.join(directory, "stubborn.pid")
if os.environ["RANK"] == stubborn:

    def note(signum: int, frame: object) -> None:
        with open(os.path.join(directory, "sigterm"), "a") as handle:
            handle.write("SIGTERM\n")

    signal.signal(signal.SIGTERM, note)
    with open(pid_file + ".tmp", "w") as handle:
        handle.write(str(os.getpid()))
    os.replace(pid_file + ".tmp", pid_file)
    while True:
        time.sleep(1)  # a handled signal does not end the sleep early (PEP 475)
deadline = time.monotonic() + 60
while not os.path.exists(pid_file) and time.monotonic() < deadline:
    time.sleep(0.02)
print(f"rank {os.environ['RANK']} fails on purpose", file=sys.stderr, flush=True)
sys.exit(3)
