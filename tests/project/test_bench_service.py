"""``benchmarks/bench_service.py --check``, the short form of the warm service's benchmark:
2 workers, a launch that starts the service and 2 that fork from it. Invariants only, never
a timing: every launch exits 0, every rank passes its barrier, the repeated launches' ranks
are the one service's children, and once the service is stopped no worker, service or
socket is left. The benchmark uses a runtime directory of its own, and removes it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_service.py"


def test_repeated_launches_fork_from_the_service_and_leave_nothing() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--check", "--reps", "2", "--nproc", "2"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "check: ok: 3 launches of 2 ranks" in done.stdout, done.stdout
