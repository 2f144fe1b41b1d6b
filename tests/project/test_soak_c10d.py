"""A short soak (``benchmarks/soak.py``) on c10d at ``--nnodes 3`` with a spare, the store's
candidates listed, one fault: the store's host lost (its agent and workers SIGKILLed: the
others fail over, the spare follows them, the agent started again joins the successor's
store). The invariants of ``test_soak.py`` (split from it so that two pytest workers run
them), with final weights bit-identical to an uninterrupted run with the same resumes (see
``soak_report.reference``), and another node served the store."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.short_soak import check_invariants, injected, run_soak

pytestmark = [pytest.mark.slow]


@pytest.mark.timeout(540)
def test_a_short_c10d_soak_keeps_the_invariants(tmp_path: Path) -> None:
    args = ["--minutes", "0.25", "--seed", "7", "--kinds", "store_host_lost"]
    report = run_soak(tmp_path, "c10d", args)
    (lost,) = [f for f in injected(report) if f["kind"] == "store_host_lost"]
    assert lost["successor"] not in (None, lost["node"]), lost
    check_invariants(report)
