"""phalanx.spawn and the --spawn-owner mode, with real processes and real Gloo."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import phalanx
from support.launch import PHALANX, alive, port_pair, read_pids, run_phalanx, wait_for, worker


def test_spawn_runs_fn_per_local_rank(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, worker("spawn_user.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("spawn returned")
    seen = sorted((tmp_path / f"rank{r}.txt").read_text() for r in (0, 1))
    assert seen == ["0 0 2 3.0 __mp_main__", "1 1 2 3.0 __mp_main__"]


def test_spawn_failure_raises_with_root_cause(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, worker("spawn_user.py"), str(tmp_path), "fail"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert "caught JobFailed exit_code=1: rank 1" in done.stdout
    assert "Root cause: rank 1 (local rank 1)" in done.stderr
    assert "RuntimeError: rank 1 broke" in done.stderr


def test_spawn_stall_timeout_names_the_hung_rank(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, worker("spawn_user.py"), str(tmp_path), "hang"],
        capture_output=True,
        text=True,
        timeout=120,  # the hang itself would last an hour: this only catches a missed one
    )
    assert done.returncode == 1, done.stderr
    assert "caught JobFailed exit_code=1: rank 1" in done.stdout
    assert "Root cause: rank 1 (local rank 1)" in done.stderr and "[hang]" in done.stderr
    (run_dir,) = (tmp_path / "logs").iterdir()
    stacks = (run_dir / "attempt_0" / "rank_1" / "stacks.txt").read_text()
    assert "in work" in stacks and "spawn_user.py" in stacks


def test_spawn_hang_watch_names_the_hung_rank_then_fails_the_round(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, worker("spawn_user.py"), str(tmp_path), "hangwatch"],
        capture_output=True,
        text=True,
        timeout=120,  # the hang itself would last an hour: this only catches a missed one
    )
    assert done.returncode == 1, done.stderr
    assert "hang: no progress from rank(s) " in done.stderr and "the job goes on" in done.stderr
    assert "Root cause: rank 1 (local rank 1)" in done.stderr and "[hang]" in done.stderr


@pytest.mark.parametrize("crash", [False, True], ids=["clean", "crash-then-restart"])
def test_trellis_program_runs_unchanged_on_two_nodes(tmp_path: Path, crash: bool) -> None:
    """TRELLIS.2's shape (ranks computed in main(), setup_dist with the port it was given) as
    two nodes on loopback: the workers get that very port in every round, restarts too, and
    the agents meet on master_port + 1 (it was EADDRINUSE: the agents held master_port)."""
    port = port_pair()
    flags = ["--num_nodes", "2", "--num_gpus", "1", "--master_addr", "127.0.0.1",
             "--master_port", str(port), "--out", str(tmp_path)]  # fmt: skip
    if crash:
        flags += ["--crash_rank", "1", "--max_restarts", "1"]
    nodes = [
        subprocess.Popen(
            [sys.executable, worker("trellis_spawn.py"), *flags, "--node_rank", str(node)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for node in (0, 1)
    ]
    try:
        outputs = [node.communicate(timeout=180) for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
                node.communicate()
    for node, (_, stderr) in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, stderr
    assert f"the agents meet at 127.0.0.1:{port + 1} (rdzv_port)" in outputs[0][1]
    rows = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    restart = "1" if crash else "0"
    assert rows == [
        {"rank": rank, "world": 2, "sum": 3.0, "port": str(port), "restart": restart}
        for rank in (0, 1)
    ]
    if crash:
        assert "RuntimeError: rank 1 crashes once" in outputs[1][1]
        # Its ranks report no step and no beat: back when the new round's workers finished
        # (it was "never made progress again"); no ETTR, said with what would give one.
        for _, stderr in outputs:
            assert ": making progress again after " in stderr, stderr
            assert "never" not in stderr, stderr
            assert "no ETTR: the workers reported no progress (no optimizer step, " in stderr


def test_spawn_rejects_bad_arguments() -> None:
    with pytest.raises(phalanx.UsageError) as caught:
        phalanx.spawn(print, num_gpus=0, node_rank=2, num_nodes=2, stall_timeout=-1)
    assert [p.split(":")[0] for p in caught.value.problems] == [
        "num_gpus",
        "stall_timeout",
        "node_rank",
    ]
    with pytest.raises(phalanx.UsageError) as caught:
        phalanx.spawn(print, num_gpus=1, hang_watch="floor=soon")
    assert caught.value.problems == ["hang_watch: floor must be a number, got 'soon'"]
    with pytest.raises(phalanx.UsageError) as caught:
        phalanx.spawn(print, num_gpus=1, num_nodes=2, master_port="12a")
    assert caught.value.problems == ["master_port: expected 1..65535 (0: any free port), got '12a'"]
    with pytest.raises(phalanx.UsageError) as caught:
        phalanx.spawn(print, num_gpus=1, num_nodes=2, master_port=0)
    assert caught.value.problems[0].startswith("master_port: 0 (any free port) needs num_nodes=1")
    with pytest.raises(phalanx.UsageError) as caught:
        phalanx.spawn(print, num_gpus=1, num_nodes=2, master_port=29500, rdzv_port=29500)
    assert caught.value.problems[0].startswith("rdzv_port: expected 1..65535, not master_port")


def test_spawn_owner_gets_node_flags_and_runs(tmp_path: Path) -> None:
    result = run_phalanx(
        [
            "--spawn-owner",
            "--nproc-per-node",
            "2",
            "--log-dir",
            str(tmp_path),
            worker("trellis_owner.py"),
        ]
    )
    assert result.returncode == 0, result.stderr
    rows = sorted(
        (json.loads(line.split(": ", 1)[1]) for line in result.stdout.splitlines()),
        key=lambda r: r["rank"],
    )
    assert rows == [{"rank": r, "world": 2, "sum": 3.0, "has_RANK": False} for r in (0, 1)]
    assert all(line.startswith("[node0]: ") for line in result.stdout.splitlines())


def test_spawn_owner_dry_run_shows_flags(tmp_path: Path) -> None:
    result = run_phalanx(
        [
            "--spawn-owner",
            "--spawn-owner-flags",
            "num_gpus=--gpus",
            "--nproc-per-node",
            "4",
            "--dry-run",
            worker("trellis_owner.py"),
            "--x",
        ]
    )
    assert result.returncode == 0, result.stderr
    assert (
        "trellis_owner.py --x --num_nodes 1 --node_rank 0 --gpus 4 --master_addr" in result.stdout
    )
    assert "RANK=" not in result.stdout.replace("TORCHELASTIC", "")


def test_kill_9_in_spawn_owner_mode_takes_the_spawned_workers_too(tmp_path: Path) -> None:
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    launcher = subprocess.Popen(
        [
            *PHALANX,
            "--spawn-owner",
            "--nproc-per-node",
            "2",
            "--log-dir",
            str(tmp_path / "logs"),
            worker("trellis_owner.py"),
            "--pid_dir",
            str(pid_dir),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    pids: list[int] = []
    try:
        wait_for(lambda: len(read_pids(pid_dir)) == 2, 90, "two spawned workers")
        pids = read_pids(pid_dir)
        launcher.kill()
        launcher.wait(10)
        wait_for(lambda: not any(alive(pid) for pid in pids), 2, "the spawned workers to die")
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
