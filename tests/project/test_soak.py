"""A short soak (``benchmarks/soak.py``): three agents in network namespaces on a real
3-member etcd, six faults of six kinds from a fixed seed, one every 12 s. Asserts the
invariants only, never a timing: the job finishes with final weights bit-identical to an
uninterrupted run, every checkpoint loads, no process is left in any namespace, no job
cgroup is left, the store's keys stay bounded, and the agents that lived through it did not
grow (RSS, threads, descriptors)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from support.netns import unavailable_reason
from support.tools import needs_etcd

pytestmark = [pytest.mark.slow, needs_etcd]

SOAK = Path(__file__).resolve().parents[2] / "benchmarks" / "soak.py"


@pytest.mark.timeout(540)
def test_a_short_soak_keeps_the_invariants(tmp_path: Path) -> None:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    out = tmp_path / "soak"
    argv = [sys.executable, str(SOAK), "--minutes", "1.2", "--every", "12", "--seed", "1",
            "--out", str(out)]  # fmt: skip
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as soak:
        try:
            stdout, stderr = soak.communicate(timeout=420)
        except subprocess.TimeoutExpired:
            soak.terminate()  # the soak removes its namespaces, mounts and etcd on SIGTERM
            stdout, stderr = soak.communicate(timeout=60)
    done = subprocess.CompletedProcess(argv, soak.returncode, stdout, stderr)
    report = json.loads((out / "report.json").read_text())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    injected = [f for f in report["faults"] if "skipped" not in f]
    assert len(injected) >= 5 and len({f["kind"] for f in injected}) >= 5
    assert report["finished"] and report["bit_identical"]
    assert report["checkpoints"] >= 1 and not report["checkpoints_bad"]
    assert not any(report["leftovers"]["processes"].values()), report["leftovers"]
    assert not report["leftovers"]["cgroups"]
    assert not report["agents_grew"]
    keys = report["store_keys"]
    assert max(keys) <= 4 * max(keys[0], 25), keys
