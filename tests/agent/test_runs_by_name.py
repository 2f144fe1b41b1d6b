"""Finding a run after the fact: ``status``, ``logs``, ``stacks``, ``timeline`` and ``stop``
take a run's name as ``phalanx ls`` lists it, a unique prefix or ``last``; ``ls`` says where
the runs are; ``phalanx clean`` removes old runs and never a running job's. Real jobs under
the default log base (``TMPDIR`` set to the test's own directory)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from support.launch import launched, run_phalanx, wait_for, worker


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "TMPDIR": str(tmp_path)}


def _base(tmp_path: Path) -> Path:
    return tmp_path / f"phalanx-{os.geteuid()}"


def _finished_run(tmp_path: Path, name: str) -> Path:
    """A real one-rank job named ``name`` under the default log base; its directory."""
    base = _base(tmp_path)
    before = set(base.iterdir()) if base.is_dir() else set()
    done = run_phalanx(
        ["--nproc-per-node", "1", "--rdzv-id", name, worker("steps_slowly.py"), "1"],
        env=_env(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    (run_dir,) = set(base.iterdir()) - before
    return run_dir


def test_a_run_is_found_by_its_name_a_prefix_or_last(tmp_path: Path) -> None:
    env = _env(tmp_path)
    first = _finished_run(tmp_path, "demo-a")
    second = _finished_run(tmp_path, "demo-b")
    listed = run_phalanx(["ls"], env=env, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[0] for line in listed.stdout.splitlines()[1:]] == [second.name, first.name]
    assert f"2 run(s) in {_base(tmp_path)}" in listed.stderr
    for given, expected in ((first.name, first), ("demo-a", first), ("last", second)):
        shown = run_phalanx(["status", given, "--json"], env=env, timeout=60)
        assert shown.returncode == 0, (given, shown.stderr)
        assert json.loads(shown.stdout)["run_dir"] == str(expected), given
    logs = run_phalanx(["logs", "demo-b"], env=env, timeout=60)
    assert logs.returncode == 0 and "rank 0 step 0" in logs.stdout, logs.stderr
    drawn = run_phalanx(["timeline", "last"], env=env, timeout=60)
    assert drawn.returncode == 0, drawn.stderr
    for command in ("status", "logs", "stacks", "timeline", "stop"):
        both = run_phalanx([command, "demo"], env=env, timeout=60)
        assert both.returncode == 2, (command, both.stderr)
        assert both.stderr.splitlines() == [
            f"phalanx: error: {command}: 'demo' names 2 runs in {_base(tmp_path)}: "
            f"{first.name}, {second.name}; give more of the name"
        ]
        missing = run_phalanx([command, "nosuch"], env=env, timeout=60)
        assert missing.returncode == 2 and len(missing.stderr.splitlines()) == 1, command
        assert f"nor a run's name in {_base(tmp_path)}" in missing.stderr


def test_clean_removes_old_runs_and_never_a_running_one(tmp_path: Path) -> None:
    env = _env(tmp_path)
    old = _finished_run(tmp_path, "old")
    recent = _finished_run(tmp_path, "recent")
    ten_days_ago = time.time() - 10 * 86400
    os.utime(old / "events.jsonl", (ten_days_ago, ten_days_ago))
    base = _base(tmp_path)
    for argv in (["clean"], ["clean", "--older-than", "7 days"], ["clean", "--keep", "-1"]):
        refused = run_phalanx(argv, env=env, timeout=60)
        assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1, argv
    helped = run_phalanx(["clean", "--help"], env=env, timeout=60)
    assert "--older-than AGE" in helped.stdout and "--keep N" in helped.stdout
    assert "phalanx clean --older-than 7d" in run_phalanx(["--help"], env=env, timeout=60).stdout
    args = ["--nproc-per-node", "1", "--rdzv-id", "live", worker("steps_slowly.py"), "100000"]
    with launched(args, env=env) as agent:
        wait_for(lambda: len(list(base.iterdir())) == 3, 60, "the running job's directory")
        (running,) = set(base.iterdir()) - {old, recent}
        wait_for(lambda: (running / "launcher.json").exists(), 60, "the agent's launcher.json")
        dry = run_phalanx(["clean", "--keep", "0", "--dry-run"], env=env, timeout=60)
        assert dry.returncode == 0, dry.stderr
        assert f"would remove {old}" in dry.stderr and f"would remove {recent}" in dry.stderr
        assert f"kept {running.name} (running)" in dry.stderr
        assert set(base.iterdir()) == {old, recent, running}
        aged = run_phalanx(["clean", "--older-than", "7d"], env=env, timeout=60)
        assert aged.returncode == 0, aged.stderr
        assert set(base.iterdir()) == {recent, running}
        every = run_phalanx(["clean", "--keep", "0"], env=env, timeout=60)
        assert every.returncode == 0, every.stderr
        assert set(base.iterdir()) == {running}
        assert "removed 1 run(s), kept 1" in every.stderr
        stopped = run_phalanx(["stop", "last"], env=env, timeout=60)
        assert stopped.returncode == 0, stopped.stderr
        assert agent.wait(60) == 143
    assert json.loads((running / "report.json").read_text())["outcome"] == "interrupted"
