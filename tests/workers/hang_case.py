# usage: hang_case.py CASE -- one case of the hang corpus (support/hang_corpus.py), 2 ranks.
# Durations are real-scale seconds times $HANG_SCALE. A hang case makes steps, then rank 1
# hangs for real at step HANG_STEP (writing the wall time to $HANG_MARK first) while rank 0
# goes on stepping (or waits for it in a collective); a healthy case runs its pattern for
# RUN seconds and exits 0. Every step is phalanx.step(n).
import ctypes
import gc
import itertools
import os
import queue
import random
import signal
import sys
import threading
import time

import phalanx

CASE = sys.argv[1]
S = float(os.environ.get("HANG_SCALE", "1"))
RANK = int(os.environ["RANK"])
HANG_STEP, STEP, RUN = 20, 0.5 * S, 150 * S
TORCH = {"asleep_collective", "mismatched_collectives", "checkpoint_save"}
dist = None
if CASE in TORCH:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")


def mark() -> None:
    with open(os.environ["HANG_MARK"], "w") as out:
        out.write(str(time.time()))


def hang_here() -> None:
    mark()
    if CASE == "mismatched_collectives":
        dist.broadcast(torch.ones(2), src=1)  # while rank 0 all-reduces
    elif CASE == "asleep_collective":
        time.sleep(10**6)  # the others wait in the all-reduce below
    elif CASE == "python_loop":
        spin = 0
        while True:
            spin += 1
    elif CASE == "sigstop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif CASE == "io_fuse":  # the filesystem stops answering writes: D state
        with open(os.path.join(os.environ["HANG_FS"], "data.bin"), "wb") as out:
            out.write(b"x")
    elif CASE == "deadlock":
        deadlock()
    elif CASE == "c_call":  # a read on a pipe nobody writes, in C
        r, _w = os.pipe()
        buf = ctypes.create_string_buffer(1)
        while True:
            ctypes.CDLL(None, use_errno=True).read(r, buf, 1)


def deadlock() -> None:
    a, b, both = threading.Lock(), threading.Lock(), threading.Barrier(2)

    def take(first: threading.Lock, second: threading.Lock) -> None:
        with first:
            both.wait()
            with second:
                pass

    threads = [threading.Thread(target=take, args=p) for p in ((a, b), (b, a))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def loader_queue(kill_at: int | None, stall_every: int | None) -> "queue.Queue[int]":
    """A prefetch thread feeding batches: from a torch DataLoader whose worker SIGKILLs
    itself at item ``kill_at`` (the thread dies of torch's error; the queue stays empty), or
    from a source that stalls 10 s every ``stall_every`` items."""
    batches: queue.Queue[int] = queue.Queue(maxsize=2)

    def feed() -> None:
        if kill_at is not None:
            from torch.utils.data import DataLoader, Dataset

            class Items(Dataset):  # type: ignore[type-arg]
                def __len__(self) -> int:
                    return 10**6

                def __getitem__(self, i: int) -> int:
                    if i == kill_at:
                        mark()  # the fault; the prefetched batches run out a few steps on
                        os.kill(os.getpid(), signal.SIGKILL)
                    return i

            for item in DataLoader(Items(), batch_size=None, num_workers=1):
                batches.put(int(item))
        for i in range(10**6):
            if stall_every and i and i % stall_every == 0:
                time.sleep(10 * S)
            batches.put(i)

    threading.Thread(target=feed, daemon=True).start()
    return batches


def hang_case() -> None:
    t = torch.ones(1) if dist is not None else None
    dead = CASE == "dataloader_dead"
    batches = loader_queue(HANG_STEP if RANK == 1 else None, None) if dead else None
    for n in range(10**9):
        phalanx.step(n)
        time.sleep(STEP)
        if batches is not None:
            batches.get()  # rank 1's, after its loader died: forever
        if RANK == 1 and n == HANG_STEP and batches is None:
            hang_here()
        if t is not None:
            dist.all_reduce(t)


class SlowToSave:
    """Pickles in 25 s: a checkpoint save that takes that long."""

    def __reduce__(self) -> tuple[type, tuple[()]]:
        time.sleep(25 * S)
        return (dict, ())


class Silences:
    """The longest time between two steps of this rank (start-up included), written to
    $HANG_GAPS.<rank> at the end: the figure the corpus's bounds are chosen against."""

    def __init__(self) -> None:
        self.last, self.longest = time.monotonic(), 0.0

    def step(self, n: int) -> None:
        now = time.monotonic()
        self.longest, self.last = max(self.longest, now - self.last), now
        phalanx.step(n)

    def write(self) -> None:
        with open(f"{os.environ['HANG_GAPS']}.{RANK}", "w") as out:
            out.write(f"{self.longest:.2f}")


def healthy_case() -> None:
    silences = Silences()
    start, n = time.monotonic(), 0
    if CASE == "first_step_40s":
        if RANK == 1:
            silences.step(0)  # rank 1's long step comes after its first beat
        time.sleep(40 * S)  # data loading, compiling: the main thread waits
    heap = [[i] for i in range(int(3e6 * max(S, 0.1)))] if CASE == "gc_pauses" else None
    if heap is not None:
        for pair in itertools.pairwise(heap):
            pair[0].append(pair[1])  # references for the collector to follow
    batches = loader_queue(None, 20) if CASE == "loader_stalls" else None
    step = STEP * (2 if CASE == "straggler" and RANK == 1 else 1)
    while time.monotonic() - start < RUN:
        silences.step(n)
        n += 1
        if CASE == "jitter":
            time.sleep(random.uniform(0.05, 0.5))
        elif CASE == "decay":
            time.sleep(min(3.0, 0.2 * 1.02**n) * S)
        else:
            time.sleep(step)
        if CASE == "eval" and n % 10 == 0:
            if RANK == 0:
                with phalanx.pause():  # rank 0 says so; rank 1's is bare
                    time.sleep(15 * step)
            else:
                time.sleep(15 * step)
        if CASE == "gc_pauses" and n % 10 == 0:
            gc.collect()
        if batches is not None:
            batches.get()
        if CASE == "checkpoint_save" and n % 60 == 20:
            if RANK == 0:
                phalanx.checkpoint.save({"w": SlowToSave()}, os.environ["HANG_CKPT"], n)
            dist.barrier()  # rank 1 waits for the save, unpaused
    silences.write()


def silent_then_on() -> None:
    for n in range(60):
        phalanx.step(n)
        time.sleep(STEP)
        if RANK == 1 and n == HANG_STEP:
            mark()
            if CASE == "long_pause":
                with phalanx.pause():  # twice the floor, under the grace: not named
                    time.sleep(120 * S)
            else:
                time.sleep(120 * S)  # twice the floor: named; then it moves again


if CASE in ("stall_then_resume", "long_pause"):
    silent_then_on()
elif CASE in {"asleep_collective", "python_loop", "mismatched_collectives", "sigstop", "io_fuse",
            "deadlock", "dataloader_dead", "c_call"}:  # fmt: skip
    hang_case()
else:
    healthy_case()
