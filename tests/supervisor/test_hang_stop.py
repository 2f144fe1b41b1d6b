"""The stop after a hang: the round is stopped as soon as it fails, with every rank's stack on
file. Real workers, real Gloo, a rank that really sleeps; the dumps are counted, never timed."""

from __future__ import annotations

import json
import os
import re
import sys
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


# A py-spy that "dumps" until its rank has answered the agent's last-step notice
# (``laststep.done`` in the rank directory, where its output goes), a minute at most.
ANSWER_WAITER = """#!{python}
import os, sys, time

rank_dir = os.path.dirname(os.readlink("/proc/self/fd/1"))
for _ in range(1200):
    if os.path.exists(os.path.join(rank_dir, "laststep.done")):
        break
    time.sleep(0.05)
else:
    sys.exit("stand-in: no answer in a minute")
print("stand-in: the last step was answered while this dump ran", flush=True)
"""


def test_a_hangs_last_step_is_asked_for_before_the_stacks_are_taken(tmp_path: Path) -> None:
    """A rank that holds a last step sleeps past ``--stall-timeout``: the round fails, and
    the rank is asked for its step as the round is failed, before the report's dump, so it
    writes it while the stacks are taken; the stop then finds it written. The dump here is a
    py-spy stand-in that lasts until the answer is in: asked only by the stop, after the
    dump, the answer would come once py-spy was given up on (10 s) and killed."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "py-spy"
    exe.write_text(ANSWER_WAITER.format(python=sys.executable))
    exe.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    logs = tmp_path / "logs"
    result = run_phalanx(
        ["--nproc-per-node", "1", "--max-restarts", "0", "--stall-timeout", "2",
         "--log-dir", str(logs), worker("laststep_then_sleep.py"), str(tmp_path / "ckpt")],
        env=env,
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 1 and "[hang]" in result.stderr, result.stderr
    assert "rank0 wrote its last step 7" in result.stderr, result.stderr
    (run_dir,) = logs.iterdir()
    native = (run_dir / "attempt_0" / "rank_0" / "py-spy.txt").read_text()
    assert "stand-in: the last step was answered while this dump ran" in native, native
    assert "gave no dump" not in native, native
