# usage: exit_leftovers.py OUT_DIR STATUS -- leaves behind what a script may leave at exit
# (unclosed buffered files, a gzip stream, an atexit handler, a running non-daemon thread, an
# executor never shut down), then exits with STATUS. OUT_DIR/<rank>/ shows what survived.
import atexit
import concurrent.futures
import gzip
import os
import sys
import threading
import time

out = os.path.join(sys.argv[1], os.environ.get("RANK", "plain"))
os.makedirs(out, exist_ok=True)
text = open(os.path.join(out, "text.txt"), "w", buffering=1 << 20)  # noqa: SIM115
text.write("line\n" * 1000)  # 5 kB, still in the buffer
binary = open(os.path.join(out, "data.bin"), "wb")  # noqa: SIM115
binary.write(bytes(range(256)) * 10)
# text over gzip over a buffered file
squeezed = gzip.open(os.path.join(out, "log.gz"), "wt")  # noqa: SIM115
squeezed.write("compressed " * 100)


def late_writer() -> None:
    time.sleep(0.3)
    with open(os.path.join(out, "thread.txt"), "w") as handle:
        handle.write("thread finished")


def on_exit() -> None:
    with open(os.path.join(out, "atexit.txt"), "w") as handle:
        handle.write(f"atexit ran; thread alive: {worker.is_alive()}")


atexit.register(on_exit)
worker = threading.Thread(target=late_writer)
worker.start()
pool = concurrent.futures.ThreadPoolExecutor(1)
pool.submit(time.sleep, 0.2)
print("leaving", flush=False)  # left in stdout's buffer
sys.exit(int(sys.argv[2]))
