"""The ``weakref.finalize`` callbacks registered before the fork are the template's: a warm
worker does not run them at its exit; those its script registers it runs, as python does
(docs/explanation/design.md, "Warm start": torch's import registers 134, whose unregistering
took 0.1-0.2 s of CPU at each worker's exit). Cold, the module is imported in the worker
itself, and both run. Real launches, 2 workers each; files on disk say what ran."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from support.launch import run_phalanx

MODES = {"warm": ["--preload", "finalizing"], "cold": ["--cold-start"]}
MODULE = """\
import os, weakref

class Held:
    pass

HELD = Held()  # alive to the end: its finalizer runs at exit (atexit=True)
weakref.finalize(HELD, lambda: open(os.path.join(os.environ["OUT"], f"imported.{os.getpid()}"), "w").close())
"""
SCRIPT = """\
import os, weakref
import finalizing

class Mine:
    pass

MINE = Mine()
weakref.finalize(MINE, lambda: open(os.path.join(os.environ["OUT"], f"script.{os.getpid()}"), "w").close())
"""


@pytest.mark.parametrize("mode", MODES)
def test_a_warm_worker_leaves_the_templates_finalizers_and_runs_its_own(
    tmp_path: Path, mode: str
) -> None:
    (tmp_path / "finalizing.py").write_text(MODULE)
    (tmp_path / "job.py").write_text(SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    result = run_phalanx(
        [*MODES[mode], "--standalone", "--nproc-per-node", "2", "--log-dir",
         str(tmp_path / "logs"), "job.py"],
        cwd=tmp_path, env={**os.environ, "OUT": str(out)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert ("warm start: workers fork from template" in result.stderr) == (mode == "warm")
    workers = {path.name.split(".")[1] for path in out.glob("script.*")}
    imported = {path.name.split(".")[1] for path in out.glob("imported.*")}
    assert len(workers) == 2
    # warm: the module's finalizer is the template's (the template may run it at its own
    # end, never a worker); cold: each worker imported the module, and runs it as python would
    assert (imported & workers) == (set() if mode == "warm" else workers)
