"""examples/train.py: runs under torchrun, and a run SIGKILLed after its first checkpoint and
rerun ends with weights bit-identical to an uninterrupted run."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

from phalanx import checkpoint
from phalanx.worker.progress import read as read_progress
from support.tools import TORCH_EXIT_ABORT, TORCHRUN

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "examples" / "train.py"
TINY = ROOT / "examples" / "configs" / "tiny.json"


def _env() -> dict[str, str]:
    path = os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)  # the trainer must not think it was launched already
    return env


def _torchrun(config: Path, out: Path) -> list[str]:
    return [
        *TORCHRUN, "--standalone", "--nproc-per-node", "2",
        str(TRAIN), "--config", str(config), "--output_dir", str(out),
    ]  # fmt: skip


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=180)


def _final_weights(out: Path) -> dict[str, torch.Tensor]:
    weights: dict[str, torch.Tensor] = torch.load(out / "final.pt")
    return weights


@pytest.fixture(scope="module")
def torchrun_tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One torchrun run of tiny.json (shared: the reference the other launch forms match)."""
    out = tmp_path_factory.mktemp("torchrun") / "out"
    done = _reference(_torchrun(TINY, out))
    return out, done.stdout


def _reference(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    """A torchrun run that is the reference, not what is tested. Not retried: one that dies
    of torch's own exit-time abort (a Gloo thread still joinable while the interpreter
    finalizes: "terminate called without an active exception", SIGABRT; seen about once in
    twenty suite runs, under torchrun and under cold phalanx workers alike) is put on record
    as an expected failure with its output, not hidden by a second run. Any other failure
    of the reference fails the test."""
    done = _run(cmd)
    if done.returncode != 0 and TORCH_EXIT_ABORT in done.stderr:
        pytest.xfail(f"torchrun's reference run hit torch's exit-time abort: {done.stderr[-1500:]}")
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_tiny_config_under_torchrun(torchrun_tiny: tuple[Path, str]) -> None:
    out, stdout = torchrun_tiny
    cfg = json.loads(TINY.read_text())
    assert "world size 2, gloo on cpu; starting at step 0" in stdout
    assert f"step {cfg['steps']}/{cfg['steps']} loss " in stdout
    assert "samples/s" in stdout
    assert stdout.count("world size") == 1  # only rank 0 prints
    weights = _final_weights(out)
    assert set(weights) == {"0.weight", "0.bias", "3.weight", "3.bias"}
    kept = [c.step for c in checkpoint.checkpoints(out / "checkpoints")]
    assert kept == [cfg["steps"] - cfg["checkpoint_every"], cfg["steps"]]  # keep = 2


def _same_weights(a: Path, b: Path) -> bool:
    left, right = _final_weights(a), _final_weights(b)
    return list(left) == list(right) and all(torch.equal(left[k], right[k]) for k in left)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_spawn_and_phalanx_cli_match_torchrun_bit_for_bit(
    torchrun_tiny: tuple[Path, str], tmp_path: Path
) -> None:
    args = ["--config", str(TINY), "--output_dir"]
    spawned = _run([sys.executable, str(TRAIN), *args, str(tmp_path / "spawn"), "--num_gpus", "2",
                    "--master_port", str(_free_port())])  # fmt: skip
    assert spawned.returncode == 0, spawned.stderr[-3000:]
    assert "world size 2, gloo on cpu" in spawned.stdout
    cli = _run([sys.executable, "-m", "phalanx", "--standalone", "--nproc-per-node", "2",
                str(TRAIN), *args, str(tmp_path / "cli")])  # fmt: skip
    assert cli.returncode == 0, cli.stderr[-3000:]
    assert _same_weights(torchrun_tiny[0], tmp_path / "spawn")
    assert _same_weights(torchrun_tiny[0], tmp_path / "cli")


def test_rerun_after_the_end_trains_nothing(torchrun_tiny: tuple[Path, str]) -> None:
    out = torchrun_tiny[0]
    before = _final_weights(out)
    again = _run(_torchrun(TINY, out))
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resumed from step {json.loads(TINY.read_text())['steps']}" in again.stdout
    after = _final_weights(out)
    assert all(torch.equal(before[k], after[k]) for k in before)


def _node_command(node_rank: int, out: Path, addr: str, port: str) -> list[str]:
    return [
        sys.executable, str(TRAIN), "--config", str(TINY), "--output_dir", str(out),
        "--num_gpus", "2", "--num_nodes", "2", "--node_rank", str(node_rank),
        "--master_addr", addr, "--master_port", port,
    ]  # fmt: skip


def test_two_nodes_run_the_same_command_but_node_rank(hosts: Any, tmp_path: Path) -> None:
    """Two hosts (network namespaces, or loopback where they cannot be made) each run
    ``train.py ... --num_nodes 2 --num_gpus 2 --node_rank K``: one world of 4."""
    net = hosts(2)
    port = str(_free_port())
    procs = [
        subprocess.Popen(
            net.command(rank, _node_command(rank, tmp_path / f"node{rank}", net.addr(0), port)),
            env={**_env(), **net.env()},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for rank in (0, 1)
    ]
    try:
        results = [p.communicate(timeout=180) for p in procs]
    finally:
        for p in procs:
            _kill_tree(p)
    for p, (_, err) in zip(procs, results, strict=True):
        assert p.returncode == 0, err[-3000:]
    assert "world size 4" in results[0][0]  # rank 0 (on node 0) reports the world it joined
    assert (tmp_path / "node0" / "final.pt").exists()  # rank 0 lives on node 0
    assert not (tmp_path / "node1" / "final.pt").exists()


def test_bad_config_is_a_usage_error_without_traceback(tmp_path: Path) -> None:
    config = tmp_path / "bad.json"
    config.write_text(json.dumps({"steps": 0, "learning_rate": 1}))
    done = _run([sys.executable, str(TRAIN), "--config", str(config), "--output_dir", "x"])
    assert done.returncode == 2
    assert "unknown keys ['learning_rate']" in done.stderr
    assert "Traceback" not in done.stderr


def _kill_tree(proc: subprocess.Popen[str]) -> list[psutil.Process]:
    """SIGKILL a launcher we started, its process group and each worker's (torchrun gives
    every worker its own session), then wait for all of them. Returns what was running."""
    if proc.poll() is not None:
        return []  # already reaped: its pid (and group id) may belong to someone else now
    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    groups = {proc.pid}
    for p in tree:
        with contextlib.suppress(ProcessLookupError):  # it may already be gone
            groups.add(os.getpgid(p.pid))
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    proc.wait(timeout=30)
    psutil.wait_procs(tree, timeout=30)
    return tree


def test_killed_run_resumes_to_bit_identical_weights(tmp_path: Path) -> None:
    config = tmp_path / "long.json"
    cfg = {**json.loads(TINY.read_text()), "steps": 400, "checkpoint_every": 20, "log_every": 100}
    config.write_text(json.dumps(cfg))

    _reference(_torchrun(config, tmp_path / "straight"))  # (the CI run of 6ae53ee hit the abort here)

    out = tmp_path / "killed"
    proc = subprocess.Popen(
        _torchrun(config, out),
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    tree: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 120
        while checkpoint.latest(out / "checkpoints") is None:
            assert proc.poll() is None, f"run ended ({proc.returncode}) before a checkpoint"
            assert time.monotonic() < deadline, "no checkpoint within 120 s"
            time.sleep(0.01)
    finally:
        tree = _kill_tree(proc)
    assert len(tree) >= 3  # torchrun and its two workers
    assert not any(p.is_running() for p in tree)
    killed_at = checkpoint.latest(out / "checkpoints")
    assert killed_at is not None and killed_at.step < cfg["steps"]
    assert not (out / "final.pt").exists(), "the run finished before the kill; make it longer"

    rerun = _run(_torchrun(config, out))
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    resumed = int(rerun.stdout.split("resumed from step ")[1].split()[0])
    assert killed_at.step <= resumed < cfg["steps"]

    expected, got = _final_weights(tmp_path / "straight"), _final_weights(out)
    assert list(expected) == list(got)
    for name, tensor in expected.items():
        assert torch.equal(tensor, got[name]), f"{name} differs after resume"


def _phalanx(config: Path, out: Path, logs: Path, *flags: str) -> list[str]:
    return [
        sys.executable, "-m", "phalanx", "--standalone", "--nproc-per-node", "2",
        "--log-dir", str(logs), *flags,
        str(TRAIN), "--config", str(config), "--output_dir", str(out),
    ]  # fmt: skip


def _worker_holding(launcher: psutil.Process, path: Path) -> psutil.Process | None:
    """The launcher's descendant that maps the counters ``path`` leads to: the worker whose
    progress it is (a warm worker's RANK is not in /proc/PID/environ: it was set after the
    fork). The counters are the agent's memfd, told apart from the other ranks' by inode."""
    with contextlib.suppress(OSError):
        inode = str(os.stat(path).st_ino)
        for proc in launcher.children(recursive=True):
            with contextlib.suppress(OSError):
                maps = Path(f"/proc/{proc.pid}/maps").read_text().splitlines()
                # addr perms offset dev inode path: this memfd mapped (not a file of that inode)
                if any(m.split()[4:6] == [inode, "/memfd:phalanx-progress"] for m in maps):
                    return proc
    return None


def _kill_at(cmd: list[str], logs: Path, beats: int, attempt: str = "attempt_0") -> tuple[int, int]:
    """Run ``cmd``; once rank 1 of ``attempt`` has done ``beats`` optimizer steps, SIGKILL that
    worker; return the launcher's exit code and the beats rank 1 had when it was killed."""
    proc = subprocess.Popen(
        cmd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, f"run ended ({proc.returncode}) before step {beats}"
            assert time.monotonic() < deadline, f"rank 1 did not reach {beats} steps in 120 s"
            found = list(logs.glob(f"*/{attempt}/rank_1/progress"))
            seen = read_progress(str(found[0])) if found else None
            if seen is not None and seen[0] >= beats:
                victim = _worker_holding(psutil.Process(proc.pid), found[0])
                if victim is not None:
                    victim.kill()
                    victim.wait(30)
                    at = read_progress(str(found[0]))  # after the kill: its last count
                    break
            time.sleep(0.005)
        code = proc.wait(timeout=120)
    finally:
        _kill_tree(proc)  # nothing is left if an assertion above failed
    assert at is not None
    return code, at[0]


def test_killed_at_random_steps_under_phalanx_resumes_bit_identically(tmp_path: Path) -> None:
    """Under phalanx (warm), rank 1 is SIGKILLed at a step chosen at random per run: first the
    job fails and is rerun; in the rerun it is killed again and phalanx restarts the group
    itself. The final weights equal an uninterrupted phalanx run's, bit for bit. The seed is
    printed (pytest -s) and in every assertion message; PHALANX_TEST_SEED=N replays it."""
    seed = int(os.environ.get("PHALANX_TEST_SEED") or random.SystemRandom().randrange(2**32))
    rng = random.Random(seed)
    print(f"kill seed {seed} (replay: PHALANX_TEST_SEED={seed})")
    config = tmp_path / "long.json"
    cfg = {**json.loads(TINY.read_text()), "steps": 200, "checkpoint_every": 10, "log_every": 100}
    config.write_text(json.dumps(cfg))
    steps = int(cfg["steps"])

    straight = _run(_phalanx(config, tmp_path / "straight", tmp_path / "logs0"))
    assert straight.returncode == 0, straight.stderr[-3000:]

    out = tmp_path / "killed"
    first = rng.randrange(1, steps - 20)
    code, killed_at = _kill_at(_phalanx(config, out, tmp_path / "logs1"), tmp_path / "logs1", first)
    why = f"seed {seed}: first kill aimed at step {first}, rank 1 had done {killed_at}"
    assert code == 128 + signal.SIGKILL, why  # the root cause's status: killed by SIGKILL
    assert not (out / "final.pt").exists(), why
    resumed = checkpoint.latest(out / "checkpoints")
    start = 0 if resumed is None else resumed.step
    # Rank 0 saves after its own step, which needs rank 1's gradients of that step, not its
    # optimizer step: rank 1 may die between the two, one step behind the newest checkpoint.
    assert start <= killed_at + 1, why

    second = rng.randrange(1, steps - start - 10)  # steps after the resume
    code, again = _kill_at(
        _phalanx(config, out, tmp_path / "logs2", "--max-restarts", "1"), tmp_path / "logs2", second
    )
    why += f"; rerun from step {start} killed after {again} more steps (aimed at {second})"
    assert code == 0, why  # the one restart within the run resumed and finished
    assert len(list((tmp_path / "logs2").glob("*/attempt_1/rank_1"))) == 1, why  # restarted
    expected, got = _final_weights(tmp_path / "straight"), _final_weights(out)
    assert list(expected) == list(got), why
    for name, tensor in expected.items():
        assert torch.equal(tensor, got[name]), f"{name} differs after resume; {why}"
