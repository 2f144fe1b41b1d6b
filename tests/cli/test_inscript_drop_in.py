"""The in-script API as a drop-in: a ``phalanx.spawn`` program stopped from outside
(``phalanx stop``, or Ctrl-C) ends as the CLI does, 143 or 130 and one line, no traceback,
and one that catches ``Interrupted`` still cleans up; ``add_dist_args`` on TRELLIS.2's own
parser. Real programs, real signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from support.launch import run_phalanx, wait_for, worker


@pytest.mark.parametrize(
    ("how", "catch", "code"),
    [("phalanx stop", False, 143), ("SIGINT", False, 130), ("phalanx stop", True, 143)],
    ids=["stop-uncaught", "sigint-uncaught", "stop-caught"],
)
def test_a_stopped_spawn_program_ends_with_the_signals_code(
    tmp_path: Path, how: str, catch: bool, code: int
) -> None:
    program = subprocess.Popen(
        [sys.executable, worker("spawn_stop.py"), str(tmp_path), *(["catch"] if catch else [])],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        wait_for(lambda: (tmp_path / "ready").exists(), 120, "the spawned process")
        if how == "SIGINT":
            os.kill(program.pid, signal.SIGINT)  # as Ctrl-C would, to the program only
        else:
            (run_dir,) = (tmp_path / "logs").iterdir()
            stop = run_phalanx(["stop", str(run_dir)], timeout=60)
            assert stop.returncode == 0, stop.stderr
        _, err = program.communicate(timeout=60)
    finally:
        if program.poll() is None:
            os.killpg(program.pid, signal.SIGKILL)
            program.communicate()
    assert program.returncode == code, err
    # The program's own lines (a worker's, prefixed, may show its KeyboardInterrupt).
    own = "\n".join(line for line in err.splitlines() if not line.startswith("[rank"))
    assert "Traceback" not in own, err
    name = "SIGINT" if code == 130 else "SIGTERM"
    assert [line for line in err.splitlines() if "stopped by" in line] == [
        f"phalanx: stopped by {name}"
    ], err
    if catch:
        assert (tmp_path / "cleaned").read_text() == f"{code} {name}"


def test_add_dist_args_keeps_the_flags_a_trellis_parser_already_has(tmp_path: Path) -> None:
    """TRELLIS.2's parser defines --num_nodes ... --master_port itself; add_dist_args on it
    adds only --backend (it was argparse's "conflicting option string"), and the program's
    own flags, defaults and types are the ones parsed."""
    program = [sys.executable, worker("trellis_parser.py"), "--out", str(tmp_path)]
    helped = subprocess.run([*program, "--help"], capture_output=True, text=True, timeout=120)
    assert helped.returncode == 0, helped.stderr
    assert "Number of GPUs per node" in helped.stdout and "--backend" in helped.stdout
    done = subprocess.run(
        [*program, "--num_gpus", "2", "--master_port", "0", "--backend", "gloo"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    rows = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert rows == [
        {"rank": r, "world": 2, "num_gpus": 2, "master_port": "0", "backend": "gloo"}
        for r in (0, 1)
    ]
