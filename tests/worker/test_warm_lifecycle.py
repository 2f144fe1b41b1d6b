"""The warm-start template's life: restarts fork from it, nothing outlives the launcher, and
when it cannot be made phalanx says so in one line and starts the workers cold."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from phalanx.config import WorkersConfig
from phalanx.plan import WORKER_BOOT, WorkerCommand, WorkerPlan
from phalanx.supervisor.warm import fork_request, template_env
from support.launch import (
    PHALANX,
    WORKERS,
    alive,
    end_all,
    run_phalanx,
    start_tree,
    wait_for,
    worker,
)

MODES = {"warm": [], "cold": ["--cold-start"]}
FALLBACK = "warm start unavailable"


def template_pid(stderr: str) -> int | None:
    found = re.search(r"fork from template pid (\d+)", stderr)
    return int(found.group(1)) if found else None


@pytest.mark.parametrize("mode", MODES)
def test_restarts_fork_from_the_same_template(tmp_path: Path, mode: str) -> None:
    result = run_phalanx(
        [
            *MODES[mode],
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "1",
            "--log-dir",
            str(tmp_path),
            worker("warm_restart.py"),
        ]
    )
    assert result.returncode == 0, result.stderr
    assert "restarting the worker group (restart 1 of 1)" in result.stderr
    seen = [json.loads(line.split("]: ", 1)[1]) for line in result.stdout.splitlines()]
    assert sorted((s["restart"], s["rank"]) for s in seen) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    parents = {s["ppid"] for s in seen}
    assert len(parents) == 1  # cold: the agent; warm: the template, for both attempts
    template = template_pid(result.stderr)
    if mode == "warm":
        assert parents == {template}
        assert result.stderr.count("fork from template pid") == 1  # made once per run
        assert not alive(template)  # and gone with the launcher
    else:
        assert template is None


def _processes(mode: str, pids: list[int], stderr_path: Path) -> list[int]:
    """The workers, their children and (warm) the template: all must be alive now."""
    template = template_pid(stderr_path.read_text())
    assert (template is not None) == (mode == "warm")
    everything = [*pids, *([template] if template is not None else [])]
    assert all(alive(pid) for pid in everything)
    return everything


@pytest.mark.parametrize("mode", MODES)
def test_kill_9_of_launcher_leaves_nothing(tmp_path: Path, mode: str) -> None:
    launcher, pids, stderr_path = start_tree(tmp_path, MODES[mode])
    everything = pids
    try:
        everything = _processes(mode, pids, stderr_path)
        launcher.kill()
        launcher.wait(10)
        wait_for(lambda: not any(alive(pid) for pid in everything), 5, "every process to die")
    finally:
        end_all(launcher, everything)


@pytest.mark.parametrize("mode", MODES)
def test_sigint_exits_130_and_leaves_nothing(tmp_path: Path, mode: str) -> None:
    launcher, pids, stderr_path = start_tree(tmp_path, MODES[mode])
    everything = pids
    try:
        everything = _processes(mode, pids, stderr_path)
        launcher.send_signal(signal.SIGINT)
        assert launcher.wait(30) == 130
        assert not any(alive(pid) for pid in everything)
    finally:
        end_all(launcher, everything)


def test_a_dead_template_means_a_cold_restart(tmp_path: Path) -> None:
    """The template dies mid-run: its workers die with it, one line says so, and the
    restart starts the workers cold (the launcher is their parent) and succeeds."""
    out, stderr_path = tmp_path / "out", tmp_path / "launcher.err"
    out.mkdir()
    with open(stderr_path, "wb") as stderr:
        launcher = subprocess.Popen(
            [*PHALANX, "--nproc-per-node", "2", "--max-restarts", "1", "--log-dir",
             str(tmp_path / "logs"), worker("warm_wait.py"), str(out)],
            stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True,
        )  # fmt: skip
    try:
        wait_for(lambda: len(list(out.glob("0.?"))) == 2, 60, "the first attempt's workers")
        template = template_pid(stderr_path.read_text())
        assert template is not None
        assert {int(p.read_text()) for p in out.glob("0.?")} == {template}
        os.kill(template, signal.SIGKILL)
        assert launcher.wait(60) == 0, stderr_path.read_text()
    finally:
        end_all(launcher, [])
    assert {int(p.read_text()) for p in out.glob("1.?")} == {launcher.pid}
    lines = [line for line in stderr_path.read_text().splitlines() if FALLBACK in line]
    assert len(lines) == 1 and "the template exited" in lines[0]
    assert f"see {tmp_path / 'logs'}" in lines[0] and "template.log" in lines[0]


@pytest.mark.parametrize(
    ("preload", "reason"),
    [("phalanx_no_such_module", "ModuleNotFoundError"), ("warm_thready", "started Python threads")],
)
def test_falls_back_to_cold_start_in_one_line(tmp_path: Path, preload: str, reason: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(WORKERS)}
    result = run_phalanx(
        [
            "--preload",
            preload,
            "--nproc-per-node",
            "2",
            "--log-dir",
            str(tmp_path),
            worker("echo_args.py"),
        ],
        env=env,
    )
    assert result.returncode == 0, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if FALLBACK in line]
    assert reason in line and "starting workers cold" in line
    assert template_pid(result.stderr) is None
    assert sorted(line[:8] for line in result.stdout.splitlines()) == ["[rank0]:", "[rank1]:"]
    (run_dir,) = tmp_path.iterdir()
    assert reason in (run_dir / "template.log").read_text()  # the template's traceback


def test_preload_is_imported_before_the_worker_starts(tmp_path: Path) -> None:
    script = tmp_path / "probe.py"
    script.write_text("import sys\nprint('xml.dom.minidom' in sys.modules)\n")
    for flags, expected in (
        (["--preload", "xml.dom.minidom"], "True"),
        (["--cold-start"], "False"),
    ):
        result = run_phalanx([*flags, "--log-dir", str(tmp_path / "logs"), str(script)])
        assert result.returncode == 0, result.stderr
        assert result.stdout == f"[rank0]: {expected}\n"


def test_no_python_programs_are_exec_d(tmp_path: Path) -> None:
    result = run_phalanx(["--no-python", "--log-dir", str(tmp_path), "sh", "-c", "echo $RANK"])
    assert result.returncode == 0 and result.stdout == "[rank0]: 0\n"
    assert "template" not in result.stderr and FALLBACK not in result.stderr


def test_bad_preload_name_is_a_usage_error() -> None:
    result = run_phalanx(["--preload", "numpy,not a module", worker("echo_args.py")])
    assert result.returncode == 2
    assert "--preload: 'not a module' is not a module name" in result.stderr


def _plan(command: WorkerCommand) -> WorkerPlan:
    return WorkerPlan(0, 0, command, {"RANK": "0"}, Path("/nonexistent"), frozenset())


def test_fork_request_only_for_python_files_and_modules(tmp_path: Path) -> None:
    """Read from the planned command (never from a parsed argv): a python file or module of
    this python is forked; a program, another python, a .pyc or a missing file is exec'd."""
    py = "/usr/bin/python-x"
    (tmp_path / "a.py").write_text("")
    (tmp_path / "a.pyc").write_bytes(b"")
    cwd = str(tmp_path)
    script = fork_request(_plan(WorkerCommand("script", "a.py", ("--x",), py, False)), cwd, py)
    assert script is not None
    assert (script.kind, script.target, script.args, script.cwd) == (
        "script",
        "a.py",
        ("--x",),
        cwd,
    )
    assert script.orig_argv == (py, "-u", "a.py", "--x") and script.env == {"RANK": "0"}
    module = fork_request(_plan(WorkerCommand("module", "pkg.mod", ("y",), py, False)), cwd, py)
    assert module is not None and (module.kind, module.target, module.args) == (
        "module",
        "pkg.mod",
        ("y",),
    )
    booted = fork_request(_plan(WorkerCommand("script", "a.py", ("--x",), py)), cwd, py)
    assert booted is not None and (booted.kind, booted.target, booted.args) == (
        "boot",
        "phalanx.worker.boot",
        ("a.py", "--x"),
    )
    assert booted.orig_argv == (py, "-u", *WORKER_BOOT, "a.py", "--x")
    for command in [
        WorkerCommand("script", "a.pyc", (), py, False),
        WorkerCommand("script", "missing.py", (), py, False),
        WorkerCommand("script", "a.py", (), "/other/python", False),
        WorkerCommand("program", "sh", ("-c", "true")),
    ]:
        assert fork_request(_plan(command), cwd, py) is None, command


def test_template_env_is_what_every_worker_shares() -> None:
    base = {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "4,5"}
    env = template_env(
        WorkersConfig(program="x.py", nproc_per_node=2, virtual_local_rank=True), base
    )
    assert env == {**base, "OMP_NUM_THREADS": "1"}  # torchrun's default for several workers
    env = template_env(WorkersConfig(program="x.py", nproc_per_node=1), {"OMP_NUM_THREADS": "3"})
    assert env == {"OMP_NUM_THREADS": "3"}
