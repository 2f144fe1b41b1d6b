"""The last step (``phalanx.checkpoint.LastStep``) with the bundled trainer, real Gloo and
real signals: a job stopped for a failure resumes from the step it had reached, not from the
last periodic checkpoint, and ends with the weights of an uninterrupted run."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import torch

from phalanx import checkpoint
from phalanx.resources.ports import free_port
from phalanx.worker.progress import read as read_progress
from support.hosts import Node
from support.launch import alive, launched, run_phalanx, wait_for
from support.multinode import c10d_args

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "examples" / "train.py"
TRAINER = ROOT / "benchmarks" / "soak_trainer.py"  # the same numbers, and its pid on file
EVERY = 50  # the periodic checkpoint's interval
CONFIG = {"seed": 0, "steps": 160, "dataset_size": 512, "global_batch_size": 32, "in_dim": 8,
          "hidden": 32, "checkpoint_every": EVERY, "log_every": 1000}  # fmt: skip
AIM = 65  # the fault comes once rank 1 has done this many steps: between two checkpoints
DELAY = "0.05"  # seconds each step sleeps: 35 steps (1.75 s) from AIM to the next checkpoint


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(CONFIG))
    return path


def _steps_done(logs: Path, rank: int) -> int:
    found = list(logs.glob(f"*/attempt_0/rank_{rank}/progress"))
    seen = read_progress(str(found[0])) if found else None
    return 0 if seen is None else seen[0]


def _same_weights(a: Path, b: Path) -> None:
    x, y = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    assert list(x) == list(y)
    for name in x:
        assert torch.equal(x[name], y[name]), f"{name} differs from the uninterrupted run"


def _straight(tmp_path: Path, config: Path) -> Path:
    """The uninterrupted run at the same world size (2)."""
    out = tmp_path / "straight"
    done = run_phalanx(
        ["--standalone", "--nproc-per-node", "2", "--log-dir", str(tmp_path / "straight-logs"),
         str(TRAIN), "--config", str(config), "--output_dir", str(out)],
        timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return out / "final.pt"


def test_two_nodes_resume_from_the_last_step_after_a_sigkill(
    hosts: object, nodes: list[Node], tmp_path: Path
) -> None:
    """Two nodes, one rank each. Node 1's rank is SIGKILLed between two periodic checkpoints;
    rank 0 (the other node) still holds the step the job had reached and writes it (its
    collective raises on the way out, or its agent's notice comes first). The restarted
    round resumes from that step, and the final weights equal an uninterrupted run's."""
    net = hosts(2)  # type: ignore[operator]
    config = _config(tmp_path)
    pids, out = tmp_path / "pids", tmp_path / "out"
    pids.mkdir()
    port = free_port()
    for i in (0, 1):
        args = [*c10d_args(net, port, "2"), "--max-restarts", "1", str(TRAINER),
                "--config", str(config), "--output_dir", str(out)]  # fmt: skip
        env = {"SOAK_PIDS": str(pids), "SOAK_NODE": str(i), "SOAK_STEP_DELAY": DELAY}
        nodes.append(Node(net, i, args, tmp_path, f"n{i}", env=env))
    victim_logs = nodes[1].logs

    def reached() -> bool:
        assert nodes[1].proc.poll() is None, nodes[1].stderr
        return _steps_done(victim_logs, 1) >= AIM and (pids / "1.1").exists()

    wait_for(reached, 120, f"rank 1 at step {AIM}")
    os.kill(int((pids / "1.1").read_text()), signal.SIGKILL)
    wait_for(lambda: not alive(int((pids / "1.1").read_text())), 30, "rank 1 gone")
    killed_at = _steps_done(victim_logs, 1)
    codes = [n.finish(timeout=180) for n in nodes]
    said = nodes[0].stdout + nodes[0].stderr + nodes[1].stderr
    assert codes == [0, 0], said
    resumed = [int(n) for n in re.findall(r"; resumed from step (\d+)", nodes[0].stdout)]
    why = f"rank 1 killed after step {killed_at}; resumed from {resumed}\n{said}"
    assert len(resumed) == 1, why
    # Rank 0 completes each step whose gradients rank 1 sent: rank 1's last, or the one it
    # was killed in after its all-reduce.
    assert EVERY < resumed[0] < 2 * EVERY and killed_at <= resumed[0] <= killed_at + 1, why
    assert f"saved the last step {resumed[0]}" in said or (
        f"wrote its last step {resumed[0]}" in said
    ), why
    _same_weights(_straight(tmp_path, config), out / "final.pt")


def test_a_survivor_blocked_in_a_collective_writes_its_last_step_at_the_notice(
    tmp_path: Path,
) -> None:
    """Rank 1 is frozen (SIGSTOP) between two checkpoints: rank 0's main thread waits for it
    in the next step's all-reduce, where no signal handler of Python's would ever run. The
    stall bound stops the round; before its SIGTERM the agent writes the notice, and rank 0's
    watch thread writes the step it had reached."""
    config = _config(tmp_path)
    pids, out, logs = tmp_path / "pids", tmp_path / "out", tmp_path / "logs"
    pids.mkdir()
    env = {**os.environ, "SOAK_PIDS": str(pids), "SOAK_NODE": "0", "SOAK_STEP_DELAY": DELAY}
    args = ["--standalone", "--nproc-per-node", "2", "--max-restarts", "0",
            "--stall-timeout", "3", "--shutdown-timeout", "2", "--log-dir", str(logs),
            str(TRAINER), "--config", str(config), "--output_dir", str(out)]  # fmt: skip
    frozen = None
    with launched(args, env=env) as proc:
        try:

            def reached() -> bool:
                assert proc.poll() is None, proc.communicate()[1]
                return _steps_done(logs, 1) >= AIM and (pids / "0.1").exists()

            wait_for(reached, 120, f"rank 1 at step {AIM}")
            frozen = int((pids / "0.1").read_text())
            os.kill(frozen, signal.SIGSTOP)
            stopped_at = _steps_done(logs, 1)
            _, err = proc.communicate(timeout=120)
        finally:
            if frozen is not None and alive(frozen):
                os.kill(frozen, signal.SIGKILL)  # only if phalanx left it behind (a failure)
    assert proc.returncode != 0, err
    latest = checkpoint.latest(out / "checkpoints")
    why = f"rank 1 frozen after step {stopped_at}; newest checkpoint {latest}\n{err}"
    # Rank 1 was frozen after its step, or inside the next one after its all-reduce: rank 0
    # finished that one too, then waited in the following backward's all-reduce.
    assert latest is not None and stopped_at <= latest.step <= stopped_at + 1, why
    assert latest.step % EVERY != 0, why
    assert "waiting in torch" in err and "_engine_run_backward" in err, why  # the hang report
    assert f"rank0 wrote its last step {latest.step}" in err, why
    (rank0,) = logs.glob("*/attempt_0/rank_0/stderr.log")
    assert f"saved the last step {latest.step} at the agent's notice" in rank0.read_text(), why
