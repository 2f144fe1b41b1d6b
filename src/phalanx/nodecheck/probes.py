"""This node's own part of the node check: a compute probe and the local checks.

The compute probe is a fixed matmul on the device the workers will use. On CPU it runs in
the agent itself, in plain Python (no torch import: that alone costs the agent about 2 s of
CPU, more than the whole check): ``SIZE`` x ``SIZE`` integers, ``REPS`` times, each rep
long enough (about 50 ms on an idle core) that a CPU quota throttles it (a cgroup's
``cpu.max``/``cpu.cfs_quota_us`` is spent in slices of 100 ms periods: a shorter rep could
fit in one slice and look fast); the best rep counts, so a healthy node that was merely
preempted once is not named. Where CUDA devices are visible the probe is a short child
(``gpu_probe``) that imports torch, counts the devices and times a matmul on each one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

SIZE = 32
REPS = 3
MATMULS_PER_REP = 12
GPU_TIMEOUT = 60.0  # the child's bound: importing torch and starting CUDA on a slow node
NEEDED_EVERY = 0.25  # s: how often a probe that may be given up asks whether to give it up


@dataclass
class LocalFacts:
    """What this node found: its compute figure (multiply-adds per second; None: unknown)
    and its problems, one line each."""

    compute: float | None = None
    device: str = "cpu"
    problems: list[str] = field(default_factory=list)


def cpu_matmul_rate(needed: Callable[[], bool] = lambda: False) -> float | None:
    """Multiply-adds per second of the fixed matmul, the best of ``REPS`` reps. ``needed``:
    asked before each rep; True gives the probe up (None): the round waits for this node."""
    a = [[(i * SIZE + j) % 7 + 1 for j in range(SIZE)] for i in range(SIZE)]
    columns = [list(col) for col in zip(*a, strict=True)]
    best = float("inf")
    for _ in range(REPS):
        if needed():
            return None
        began = time.perf_counter()
        for _ in range(MATMULS_PER_REP):
            product = [
                [sum(x * y for x, y in zip(row, col, strict=True)) for col in columns] for row in a
            ]
        best = min(best, time.perf_counter() - began)
        a[0][0] = product[0][0] % 7 + 1  # the next rep depends on this one
    return SIZE**3 * MATMULS_PER_REP / max(best, 1e-9)


def cuda_visible() -> bool:
    """Whether CUDA devices may be visible, without importing torch: the NVIDIA driver's
    device files, unless ``CUDA_VISIBLE_DEVICES`` hides every one."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    return Path("/dev/nvidiactl").exists() and Path("/proc/driver/nvidia/gpus").is_dir()


_GPU_CHILD = """
import json, time, torch
count = torch.cuda.device_count()
rates, problems = [], []
for d in range(count):
    try:
        x = torch.randn(2048, 2048, device=f"cuda:{d}")
        torch.cuda.synchronize(d)
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            for _ in range(10):
                y = x @ x
            torch.cuda.synchronize(d)
            best = min(best, time.perf_counter() - t)
        rates.append(2048 ** 3 * 10 / best)
    except Exception as exc:
        problems.append(f"GPU {d} did not answer: {type(exc).__name__}: {exc}"[:300])
print(json.dumps({"count": count, "rates": rates, "problems": problems}))
"""


def gpu_probe(
    nproc_per_node: int, needed: Callable[[], bool] = lambda: False
) -> LocalFacts | None:
    """The GPU probe, in a child: the device count against ``--nproc-per-node``, a matmul
    on each device; the slowest device's rate is the node's figure. ``needed``: asked every
    ``NEEDED_EVERY`` s; True kills the child and gives the probe up (None)."""
    facts = LocalFacts(device="cuda")
    try:
        with subprocess.Popen(
            [sys.executable, "-c", _GPU_CHILD], stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True,
        ) as child:  # fmt: skip
            out = _child_output(child, needed)
        if out is None:
            return None
        data = json.loads(out.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        facts.problems.append(f"the GPU probe failed: {type(exc).__name__}: {exc}"[:300])
        return facts
    count, rates = int(data["count"]), [float(r) for r in data["rates"]]
    facts.problems += [str(p) for p in data["problems"]]
    if count < nproc_per_node:
        facts.problems.append(f"{count} GPU(s) visible, --nproc-per-node {nproc_per_node}")
    facts.compute = min(rates) if rates else None
    return facts


def _child_output(child: subprocess.Popen[str], needed: Callable[[], bool]) -> str | None:
    """The GPU child's stdout once it ended (``GPU_TIMEOUT`` at most: then it is killed and
    ``TimeoutExpired`` raised); None, the child killed, as soon as ``needed()``."""
    deadline = time.monotonic() + GPU_TIMEOUT
    while True:
        try:
            return child.communicate(timeout=min(NEEDED_EVERY, max(0.0, deadline - time.monotonic())))[0]
        except subprocess.TimeoutExpired:
            if time.monotonic() < deadline and not needed():
                continue
            child.kill()
            child.communicate()
            if time.monotonic() >= deadline:
                raise
            return None


def compute_probe(
    nproc_per_node: int, needed: Callable[[], bool] = lambda: False
) -> LocalFacts | None:
    """This node's compute figure; None when ``needed()`` said, in the middle, to give it up
    (a spare that probes while it waits: ``agent.checking.probe_ahead``)."""
    if cuda_visible():
        return gpu_probe(nproc_per_node, needed)
    rate = cpu_matmul_rate(needed)
    return None if rate is None else LocalFacts(compute=rate)


def directory_problem(path: Path, what: str, min_free_mb: float) -> str | None:
    """Why ``path`` cannot take files (not writable, full, under ``min_free_mb`` free);
    None when it can. A file is really written and removed: permissions, a read-only mount
    and a full disk all show."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".phalanx-check-") as probe:
            probe.write(b"x" * 4096)
            probe.flush()
            os.fsync(probe.fileno())
        free = shutil.disk_usage(path).free / 2**20
    except OSError as exc:
        return f"{what} {path} is not writable: {exc.strerror or exc}"
    if free < min_free_mb:
        return f"{what} {path} has {free:.0f} MiB free (under {min_free_mb:g} MiB)"
    return None
