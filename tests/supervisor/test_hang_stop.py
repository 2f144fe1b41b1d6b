"""The stop after a hang: the round is stopped as soon as it fails, with every rank's stack on
file. Real workers, real Gloo, a rank that really sleeps; the dumps are counted, never timed."""

from __future__ import annotations

import json
import re
from pathlib import Path

from support.launch import run_phalanx, worker
from support.tools import needs_py_spy

SCRIPT = worker("steps_then_hang.py")
PY_SPY_DUMP = "--- py-spy dump at "  # the header of each py-spy run in a rank's py-spy.txt
ASKED = "requested by phalanx at "  # the line before each faulthandler dump in stacks.txt


@needs_py_spy
def test_a_rank_named_hung_is_not_dumped_by_py_spy_again_when_its_round_fails(
    tmp_path: Path,
) -> None:
    """Both ranks are dumped, py-spy's native stacks too, when the first is named at the 1 s
    floor (rank 0 waits for rank 1 in an all-reduce), and neither moves again: at 10 x the
    floor the round fails, and its stop waits only for the Python stacks (faulthandler), not
    for py-spy again (0.1 to 0.6 s a process: the stop's longest part). The failure report
    still names rank 1 and where it sleeps."""
    result = run_phalanx(
        ["--nproc-per-node", "2", "--max-restarts", "0", "--hang-watch", "floor=1,factor=3",
         "--log-dir", str(tmp_path), SCRIPT, "20", "1"],
        timeout=120,  # the hang itself would last an hour: this only catches a missed one
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    # named at the floor (rank 0, waiting for it, with it or a moment after), then failed
    assert re.search(r"hang: no progress from rank\(s\) [0-9, ]+ for 1 s", result.stderr)
    assert "Root cause: rank 1 (local rank 1) on" in result.stderr, result.stderr
    (run_dir,) = tmp_path.iterdir()
    attempt = run_dir / "attempt_0"
    for rank in (0, 1):
        folder = attempt / f"rank_{rank}"
        stacks, native = (folder / "stacks.txt").read_text(), (folder / "py-spy.txt").read_text()
        # named (both kinds of dump), then the round failed (the Python stacks only)
        assert stacks.count(ASKED) == 2, stacks
        assert native.count(PY_SPY_DUMP) == 1, native
    assert "hang detected, " + ASKED in (attempt / "rank_1" / "stacks.txt").read_text()
    hang = json.loads((attempt / "hang_report.json").read_text())
    assert [s["rank"] for s in hang["suspects"]] == [1], hang
    assert "steps_then_hang.py" in json.dumps(hang["suspects"]), hang  # where it sleeps
