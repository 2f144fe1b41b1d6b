"""Signals around the warm-start fork: a stop that reaches a worker the moment the template
forks it, before the worker has its own signal dispositions back, is delivered, not lost to
the template's SIG_IGN (docs/explanation/design.md, "Warm start").

The moment is made, not waited for: ``support/fork_stop.py`` runs the real launcher under
ptrace, holds each forked worker at its first stop, SIGTERMs the launcher (as ``phalanx
stop`` does) and lets the workers go once the agent's SIGTERM is pending in each.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from support.launch import PHALANX

FORK_STOP = Path(__file__).parents[1] / "support" / "fork_stop.py"
SLEEPER = """\
import pathlib, sys, time
pathlib.Path(sys.argv[1], "ran").touch()  # only if the SIGTERM was lost
time.sleep(600)
"""


def test_a_stop_that_reaches_workers_as_they_are_forked_ends_them_by_sigterm(
    tmp_path: Path,
) -> None:
    script, logs = tmp_path / "sleeper.py", tmp_path / "logs"
    script.write_text(SLEEPER)
    # A long shutdown timeout: a worker that lost its SIGTERM would run on until the SIGKILL.
    launcher = [*PHALANX, "--nproc-per-node", "2", "--shutdown-timeout", "30",
                "--log-dir", str(logs), str(script), str(tmp_path)]  # fmt: skip
    result = subprocess.run(
        [sys.executable, str(FORK_STOP), "2", "--", *launcher],
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert len(data["held"]) == 2, result.stderr  # both workers were forked by the template
    assert data["launcher"] == 143, result.stderr
    (run_dir,) = logs.iterdir()
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    exits = sorted((e["rank"], e["pid"], e["signal"]) for e in events if e["kind"] == "worker_exit")
    assert [(rank, sig) for rank, _, sig in exits] == [(0, "SIGTERM"), (1, "SIGTERM")], exits
    assert sorted(pid for _, pid, _ in exits) == sorted(data["held"])
    assert not (tmp_path / "ran").exists()  # no user code ran
