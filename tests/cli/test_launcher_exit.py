"""The launcher's exit (``worker.leave.exit_launcher``): what python's exit does that anyone
can see -- the exit code, the ``atexit`` handlers, stdout flushed to its last byte -- without
the teardown of its modules, unless a file is still open (then python's own exit flushes it).

``python -v`` says each module it tears down (``# cleanup``, ``# destroy``): none is said
when the launcher leaves by ``os._exit``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

TEARDOWN = ("# cleanup", "# destroy")


def torn_down(stderr: str) -> bool:
    return any(line.startswith(TEARDOWN) for line in stderr.splitlines())


def test_a_launch_exits_with_its_code_and_all_its_output_without_the_teardown(
    tmp_path: Path,
) -> None:
    script = tmp_path / "job.py"
    # More than any pipe or buffer holds: the launcher relays it all before it leaves.
    script.write_text(
        "import sys\nfor i in range(20000):\n    print(f'line {i:05d}')\nsys.exit(3)\n"
    )
    done = subprocess.run(
        [sys.executable, "-v", "-m", "phalanx", "--standalone", "--nproc-per-node", "1",
         "--cold-start", "--log-dir", str(tmp_path / "logs"), str(script)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 20000 and lines[-1].endswith("line 19999")
    assert "Root cause: rank 0" in done.stderr  # the report, written before the exit
    assert not torn_down(done.stderr)


@pytest.mark.parametrize("left_open", [False, True])
def test_the_exit_runs_atexit_once_and_leaves_a_file_still_open_to_python(
    tmp_path: Path, left_open: bool
) -> None:
    kept = tmp_path / "kept.txt"
    code = (
        "import atexit, sys\n"
        "from phalanx.worker.leave import exit_launcher\n"
        "class Marker:\n"
        "    def __del__(self): sys.stderr.write('marker finalized\\n')\n"
        "marker = Marker()\n"
        "atexit.register(lambda: print('atexit ran'))\n"
        f"if {left_open}:\n"
        f"    kept = open({str(kept)!r}, 'w')\n"
        "    kept.write('written, never flushed by the program')\n"
        "print('buffered', end='')\n"
        "exit_launcher(5)\n"
    )
    done = subprocess.run(
        [sys.executable, "-v", "-c", code], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 5, done.stderr[-3000:]
    assert done.stdout == "bufferedatexit ran\n"  # once, and nothing lost in a buffer
    # Left open: python's exit tears down (finalizing the marker too) and flushes the file.
    assert torn_down(done.stderr) is left_open
    assert ("marker finalized" in done.stderr) is left_open
    if left_open:
        assert kept.read_text() == "written, never flushed by the program"
