"""``--spawn-owner`` and the debugging tools: ``phalanx stacks`` says how to see the stacks
when py-spy is missing (it stands in where installed: ``test_stacks.py``), ``--stall-timeout``
is refused with its reason, and the messages count processes and ranks as they are. Real
spawn owners through the real CLI."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from support.launch import launched, run_phalanx, wait_for, worker


def _path_without_py_spy() -> str:
    """$PATH less every directory that holds a py-spy (the agent runs it by name)."""
    dirs = os.environ.get("PATH", "").split(os.pathsep)
    return os.pathsep.join(d for d in dirs if d and shutil.which("py-spy", path=d) is None)


def test_stacks_of_a_spawn_owner_without_py_spy_say_to_install_it(tmp_path: Path) -> None:
    shared, logs = tmp_path / "shared", tmp_path / "logs"
    shared.mkdir()
    env = {**os.environ, "PATH": _path_without_py_spy()}
    args = ["--spawn-owner", "--nproc-per-node", "2", "--log-dir", str(logs),
            worker("owner_wait.py"), str(shared)]  # fmt: skip
    with launched(args, env=env) as launcher:
        wait_for(lambda: len(list(shared.glob("ready.*"))) == 2, 90, "both ranks to start")
        (run_dir,) = logs.iterdir()
        result = run_phalanx(["stacks", str(run_dir)], env=env, timeout=60)
        assert result.returncode == 0, result.stderr
        assert "install py-spy (pip install py-spy)" in result.stdout, result.stdout
        assert "as a --spawn-owner or --no-python program" in result.stdout
        (shared / "go").touch()
        _, err = launcher.communicate(timeout=60)
        assert launcher.returncode == 0, err
    # One process on this node, two ranks: said so, not "all 1 workers finished".
    assert "world size 2 (ranks; one spawn-owner process per node starts them)" in err, err
    assert "the spawn-owner process finished (it started this node's 2 ranks)" in err, err
    assert "all 1 workers finished" not in err


def test_stall_timeout_with_a_spawn_owner_is_refused_with_its_reason() -> None:
    done = run_phalanx(
        ["--spawn-owner", "--stall-timeout", "30", "--nproc-per-node", "2",
         worker("owner_wait.py"), "unused"],
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "phalanx: error: --stall-timeout does not apply to --spawn-owner: its workers are its "
        "own children, whose progress phalanx cannot see"
    ]
