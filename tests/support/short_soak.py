"""A short soak (``benchmarks/soak.py``) run from a test, and the invariants every such run
keeps (``tests/project/test_soak.py`` and ``test_soak_c10d.py``: one module split in two so
that two pytest workers run the backends). Asserts the invariants only, never a timing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from support.netns import unavailable_reason

SOAK = Path(__file__).resolve().parents[2] / "benchmarks" / "soak.py"


def run_soak(tmp_path: Path, backend: str, args: list[str]) -> dict[str, Any]:
    """Run the soak (a fault every 10 s) and return its report once it exited 0; skips
    where network namespaces cannot be made."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    out = tmp_path / "soak"
    argv = [sys.executable, str(SOAK), "--backend", backend, *args, "--every", "10",
            "--out", str(out)]  # fmt: skip
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as soak:
        try:
            stdout, stderr = soak.communicate(timeout=420)
        except subprocess.TimeoutExpired:
            soak.terminate()  # the soak removes its namespaces, mounts and etcd on SIGTERM
            stdout, stderr = soak.communicate(timeout=60)
    report: dict[str, Any] = json.loads((out / "report.json").read_text())
    assert soak.returncode == 0, stdout[-3000:] + stderr[-3000:]
    return report


def injected(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The faults the soak made (not those it skipped)."""
    return [f for f in report["faults"] if "skipped" not in f]


def check_invariants(report: dict[str, Any]) -> None:
    """Finished bit-identical to an uninterrupted run, every checkpoint loads, no process is
    left in any namespace, no job cgroup is left, the agents did not grow, the store's keys
    stayed bounded."""
    assert report["finished"] and report["bit_identical"]
    assert report["checkpoints"] >= 1 and not report["checkpoints_bad"]
    assert not any(report["leftovers"]["processes"].values()), report["leftovers"]
    assert not report["leftovers"]["cgroups"]
    assert not report["agents_grew"]
    keys = report["store_keys"]
    assert max(keys) <= 4 * max(keys[0], 25), keys
