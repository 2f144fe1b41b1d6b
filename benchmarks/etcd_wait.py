"""How long ``EtcdStore.wait`` takes to see a key another client writes, on a real 3-member
etcd (``tests/support/etcd_server.py``) that a third client keeps writing unrelated keys to,
as agents' heartbeats do during a rendezvous round.

Each rep: a waiter thread calls ``wait([key])``; ``--delay`` s later the writer sets the key;
the figure is the time from the writer's ``set`` returning to the waiter's ``wait``
returning. A watch that etcd counts as "unsynced" (one asked to start at a revision the store
has already passed: someone wrote between the waiter's read and its watch) hears of the key
only from etcd's catch-up loop, which runs every 100 ms; a synced one is told at once.
Which phalanx is measured is whichever ``PYTHONPATH`` gives (printed first).

    python benchmarks/etcd_wait.py [--reps 40] [--delay 0.03] [--noise-interval 0]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path

import phalanx
from phalanx.rendezvous.stores.etcd.store import EtcdStore, create_etcd_store

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from support.etcd_server import EtcdCluster  # noqa: E402

TIMEOUT = 30.0  # one wait; only catches a hang


def _noise(store: EtcdStore, interval: float, stop: threading.Event, count: list[int]) -> None:
    """Write unrelated keys until ``stop``: every write moves etcd's revision on."""
    while not stop.is_set():
        store.set(f"noise/{count[0] % 16}", b"x")
        count[0] += 1
        if interval:
            stop.wait(interval)


def _one(waiter: EtcdStore, writer: EtcdStore, key: str, delay: float) -> float:
    """Seconds from the writer's ``set`` returning to the waiter's ``wait`` returning."""
    returned: list[float] = []
    found: list[bool] = []

    def wait() -> None:
        found.append(waiter.wait([key], TIMEOUT))
        returned.append(time.monotonic())

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    time.sleep(delay)
    writer.set(key, b"1")
    written = time.monotonic()
    thread.join(TIMEOUT + 10)
    if not found or not found[0]:
        raise RuntimeError(f"wait([{key!r}]) did not see the key within {TIMEOUT} s")
    return returned[0] - written


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=40)
    parser.add_argument("--delay", type=float, default=0.03, help="wait -> set (s)")
    parser.add_argument(
        "--noise-interval", type=float, default=0.0, help="pause between unrelated writes (s)"
    )
    args = parser.parse_args(argv)
    print(f"phalanx from {Path(phalanx.__file__).parent}")
    run_id = f"etcd-wait-{uuid.uuid4().hex[:8]}"
    with EtcdCluster(size=3) as cluster:
        stores = [create_etcd_store(cluster.endpoint_arg, run_id, {}) for _ in range(3)]
        waiter, writer, noisy = stores
        stop, count = threading.Event(), [0]
        noise = threading.Thread(target=_noise, args=(noisy, args.noise_interval, stop, count))
        noise.start()
        try:
            started = time.monotonic()
            lags = [_one(waiter, writer, f"k{i}", args.delay) for i in range(args.reps)]
            spent = time.monotonic() - started
        finally:
            stop.set()
            noise.join(TIMEOUT)
            for store in stores:
                store.close()
    lags.sort()
    ms = [lag * 1000 for lag in lags]
    print(
        f"{args.reps} waits, set {args.delay:g} s after wait, {count[0] / spent:.0f} unrelated "
        f"writes/s: set -> wait returned median {statistics.median(ms):.1f} ms, "
        f"p90 {ms[int(0.9 * (len(ms) - 1))]:.1f} ms, max {ms[-1]:.1f} ms, "
        f"{sum(m > 50 for m in ms)} of {len(ms)} over 50 ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
