"""A short soak (``benchmarks/soak.py``) on etcd: three agents in network namespaces on a real
3-member etcd, four faults of four kinds from a fixed seed (an etcd member, a link flap, a
guardian, a worker SIGKILLed while the others wait for it in an all-reduce), one every 10 s.
Asserts the invariants only, never a timing: the job finishes with final weights
bit-identical to an uninterrupted run, every checkpoint loads, no process is left in any
namespace, no job cgroup is left, the store's keys stay bounded, and the agents that lived
through it did not grow (RSS, threads, descriptors). The c10d soak is in
``test_soak_c10d.py`` (split so that two pytest workers run them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.short_soak import check_invariants, injected, run_soak
from support.tools import needs_etcd

pytestmark = [pytest.mark.slow]

KINDS = ("etcd_member", "link_flap", "guardian_kill", "worker_kill_in_collective")


@pytest.mark.timeout(540)
@needs_etcd
def test_a_short_etcd_soak_keeps_the_invariants(tmp_path: Path) -> None:
    args = ["--minutes", "0.7", "--seed", "1", "--kinds", ",".join(KINDS)]
    report = run_soak(tmp_path, "etcd", args)
    assert {f["kind"] for f in injected(report)} == set(KINDS), report["faults"]
    check_invariants(report)
