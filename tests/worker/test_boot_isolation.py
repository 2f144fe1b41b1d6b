"""The user's files never stand in for the modules phalanx imports (docs/explanation/design.md, "Warm start").

A worker's boot and the warm-start template start with the working directory off
``sys.path`` (``python -c``, not ``-m``), and the script's directory goes first on
``sys.path`` just before the script runs, as ``python script.py`` does. Each case runs the
real ``phalanx`` command, warm and cold, in a directory holding a ``types.py`` and scripts
named like standard modules (``signal.py``, ``random.py``, ``struct.py``): each of them,
imported as a module by any process (launcher, template, worker), leaves a mark and raises.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from support.launch import run_phalanx

# The console script, not ``python -m phalanx``: python's own ``-m`` would import the
# directory's types.py before any of phalanx's code runs.
PHALANX_SCRIPT = Path(sys.executable).with_name("phalanx")
MODES = {"warm": [], "cold": ["--cold-start"]}
WARM_LINE = "warm start: workers fork from template pid"
SHADOWS = ("types", "signal", "random", "struct")
PROGRAM = """\
import json, os, sys
if __name__ != "__main__":  # imported in place of the standard library's module
    open(os.path.join(os.environ["MARKS"], f"{__name__}-{os.getpid()}"), "w").close()
    raise SystemExit(f"{__file__} was imported as {__name__}")
print(json.dumps({"file": __file__, "path0": sys.path[0], "cwd": os.getcwd()}))
"""
CASES = {  # program arguments -> the directory that must be sys.path[0]
    "signal.py": ["signal.py"],
    "random.py": ["random.py"],
    "struct.py in a subdirectory": ["sub/struct.py"],
    "-m job": ["-m", "job"],
}


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    (tmp_path / "marks").mkdir()
    for name in SHADOWS:
        (work / f"{name}.py").write_text(PROGRAM)
    (work / "sub" / "struct.py").write_text(PROGRAM)
    (work / "job.py").write_text(PROGRAM)
    return work


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES)
def test_files_named_like_standard_modules_do_not_break_the_boot(
    workdir: Path, mode: str, case: str
) -> None:
    assert PHALANX_SCRIPT.is_file(), PHALANX_SCRIPT
    marks = workdir.parent / "marks"
    logs = workdir.parent / "logs"
    args = [*MODES[mode], "--log-dir", str(logs), *CASES[case]]
    result = run_phalanx(
        args, cwd=workdir, env={**os.environ, "MARKS": str(marks)}, command=[str(PHALANX_SCRIPT)]
    )
    assert result.returncode == 0, result.stderr
    assert (WARM_LINE in result.stderr) == (mode == "warm"), result.stderr
    data = json.loads(result.stdout.split("]: ", 1)[1])
    target = CASES[case][-1]
    script_dir = workdir / os.path.dirname(target) if target.endswith(".py") else workdir
    # As ``python script.py`` / ``python -m`` set it.
    assert os.path.realpath(data["path0"]) == os.path.realpath(script_dir)
    assert sorted(p.name.split("-")[0] for p in marks.iterdir()) == []  # nobody imported them
    (run_dir,) = logs.iterdir()
    if mode == "warm":
        assert "was imported as" not in (run_dir / "template.log").read_text()
