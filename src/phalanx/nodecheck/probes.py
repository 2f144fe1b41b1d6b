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
from dataclasses import dataclass, field
from pathlib import Path

SIZE = 32
REPS = 3
MATMULS_PER_REP = 12
GPU_TIMEOUT = 60.0  # the child's bound: importing torch and starting CUDA on a slow node


@dataclass
class LocalFacts:
    """What this node found: its compute figure (multiply-adds per second; None: unknown)
    and its problems, one line each."""

    compute: float | None = None
    device: str = "cpu"
    problems: list[str] = field(default_factory=list)


def cpu_matmul_rate() -> float:
    """Multiply-adds per second of the fixed matmul, the best of ``REPS`` reps."""
    a = [[(i * SIZE + j) % 7 + 1 for j in range(SIZE)] for i in range(SIZE)]
    columns = [list(col) for col in zip(*a, strict=True)]
    best = float("inf")
    for _ in range(REPS):
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


def gpu_probe(nproc_per_node: int) -> LocalFacts:
    """The GPU probe, in a child: the device count against ``--nproc-per-node``, a matmul
    on each device; the slowest device's rate is the node's figure."""
    facts = LocalFacts(device="cuda")
    try:
        done = subprocess.run(
            [sys.executable, "-c", _GPU_CHILD], capture_output=True, text=True,
            timeout=GPU_TIMEOUT,
        )  # fmt: skip
        data = json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        facts.problems.append(f"the GPU probe failed: {type(exc).__name__}: {exc}"[:300])
        return facts
    count, rates = int(data["count"]), [float(r) for r in data["rates"]]
    facts.problems += [str(p) for p in data["problems"]]
    if count < nproc_per_node:
        facts.problems.append(f"{count} GPU(s) visible, --nproc-per-node {nproc_per_node}")
    facts.compute = min(rates) if rates else None
    return facts


def compute_probe(nproc_per_node: int) -> LocalFacts:
    if cuda_visible():
        return gpu_probe(nproc_per_node)
    return LocalFacts(compute=cpu_matmul_rate())


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
