"""A short soak (``benchmarks/soak.py``), twice: three agents in network namespaces on a real
3-member etcd, four faults of four kinds from a fixed seed (an etcd member, a link flap, a
guardian, a worker SIGKILLed while the others wait for it in an all-reduce), one every 10 s;
and c10d at ``--nnodes 3`` with a spare, the store's candidates listed, one fault: the
store's host lost (its agent and workers SIGKILLed: the others fail over, the spare follows
them, the agent started again joins the successor's store). Asserts the invariants only, never a
timing: the job finishes with final weights bit-identical to an uninterrupted run (c10d: one
with the same resumes, see ``soak_report.reference``), every checkpoint loads, no process is
left in any namespace, no job cgroup is left, the store's keys stay bounded, and the agents
that lived through it did not grow (RSS, threads, descriptors)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from support.netns import unavailable_reason
from support.tools import needs_etcd

pytestmark = [pytest.mark.slow]

SOAK = Path(__file__).resolve().parents[2] / "benchmarks" / "soak.py"
ETCD_KINDS = ("etcd_member", "link_flap", "guardian_kill", "worker_kill_in_collective")
RUNS = {  # backend: its soak's arguments
    "etcd": ["--minutes", "0.7", "--seed", "1", "--kinds", ",".join(ETCD_KINDS)],
    "c10d": ["--minutes", "0.25", "--seed", "7", "--kinds", "store_host_lost"],
}  # fmt: skip


@pytest.mark.timeout(540)
@pytest.mark.parametrize("backend", [pytest.param("etcd", marks=needs_etcd), "c10d"])
def test_a_short_soak_keeps_the_invariants(tmp_path: Path, backend: str) -> None:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    out = tmp_path / "soak"
    argv = [sys.executable, str(SOAK), "--backend", backend, *RUNS[backend], "--every", "10",
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
    if backend == "c10d":  # the store's host was lost, and another node served the store
        (lost,) = [f for f in injected if f["kind"] == "store_host_lost"]
        assert lost["successor"] not in (None, lost["node"]), lost
    else:
        assert {f["kind"] for f in injected} == set(ETCD_KINDS), report["faults"]
    assert report["finished"] and report["bit_identical"]
    assert report["checkpoints"] >= 1 and not report["checkpoints_bad"]
    assert not any(report["leftovers"]["processes"].values()), report["leftovers"]
    assert not report["leftovers"]["cgroups"]
    assert not report["agents_grew"]
    keys = report["store_keys"]
    assert max(keys) <= 4 * max(keys[0], 25), keys
