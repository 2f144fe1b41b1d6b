"""``phalanx status`` on a plain training script (optimizer steps, no ``phalanx.step``) that
then hangs: the STEP column shows the optimizer steps phalanx counted, and the time the ranks
have made no progress is not reported as productive. A real job, a real hang."""

from __future__ import annotations

import json
from pathlib import Path

from support.launch import launched, run_phalanx, wait_for, worker

STEPS = 7


def _view(run_dir: Path) -> dict[str, object]:
    done = run_phalanx(["status", str(run_dir), "--json"], timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def _stalled(run_dir: Path) -> bool:
    recovery = _view(run_dir)["recovery"]
    return bool(recovery and recovery["nodes"][0]["stalled"] > 0)  # type: ignore[index]


def test_a_hung_plain_script_shows_its_optimizer_steps_and_no_productive_hang(
    tmp_path: Path,
) -> None:
    logs, marker = tmp_path / "logs", tmp_path / "stepped"
    args = ["--nproc-per-node", "1", "--log-dir", str(logs),
            worker("optim_then_hang.py"), str(marker), str(STEPS)]  # fmt: skip
    with launched(args) as agent:
        wait_for(marker.exists, 120, "the optimizer steps")
        (run_dir,) = logs.iterdir()
        # Hung from here on: the stall shows once it is over STALLED_AFTER (10 s).
        wait_for(lambda: _stalled(run_dir), 120, "status to see the ranks stalled")
        text = run_phalanx(["status", str(run_dir)], timeout=60)
        assert text.returncode == 0, text.stderr
        row = next(line for line in text.stdout.splitlines() if line.startswith("0 "))
        assert row.split()[7] == f"{STEPS}*", text.stdout
        assert "* optimizer steps (and phalanx.heartbeat() calls) counted by phalanx" in text.stdout
        ettr = next(line for line in text.stdout.splitlines() if "ETTR" in line)
        assert "s without progress since" in ettr, ettr
        node = _view(run_dir)["recovery"]["nodes"][0]  # type: ignore[index]
        # Everything after the last optimizer step is the hang: none of it is productive.
        assert node["stalled"] > 10 and node["productive"] < node["wall"] - node["stalled"]
        stop = run_phalanx(["stop", str(run_dir)], timeout=60)
        assert stop.returncode == 0, stop.stderr
        assert agent.wait(60) == 143
    final = _view(run_dir)["recovery"]["nodes"][0]  # type: ignore[index]
    assert final["stalled"] > 10, final  # stopped while hung: still not productive
