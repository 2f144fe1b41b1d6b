"""The soak's worker hang (``benchmarks/soak_trainer.py``) leaves phalanx's stack signal alone:
the hang is found, and its report has the hung rank's Python stack. A trainer that hung on
SIGUSR2 (phalanx's ``STACK_SIGNAL``) answered the dump request by hanging again: no stack, and
every hang in the soak cost the dump timeout on top of the stall timeout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.launch import PHALANX

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))
from soak_trainer import HANG_SIGNAL  # noqa: E402

CONFIG = Path(__file__).resolve().parents[2] / "examples" / "configs" / "tiny.json"


@pytest.mark.timeout(120)
def test_the_soak_hang_is_found_with_its_stack(tmp_path: Path) -> None:
    cfg = json.loads(CONFIG.read_text())
    cfg.update(steps=100_000, checkpoint_every=1000, log_every=1000)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    pids = tmp_path / "pids"
    pids.mkdir()
    env = {**os.environ, "SOAK_PIDS": str(pids), "SOAK_NODE": "0", "SOAK_STEP_DELAY": "0.01"}
    argv = [*PHALANX, "--standalone", "--nproc-per-node", "1", "--max-restarts", "0",
            "--stall-timeout", "2", "--log-dir", str(tmp_path / "logs"),
            str(BENCH / "soak_trainer.py"), "--config", str(tmp_path / "config.json"),
            "--output_dir", str(tmp_path / "job")]  # fmt: skip
    with subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, start_new_session=True) as job:  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            pid_file = pids / "0.0"
            while not (pid_file.exists() and pid_file.read_text()):
                assert job.poll() is None and time.monotonic() < deadline, job.stderr
                time.sleep(0.1)
            time.sleep(1)  # a few steps, so the rank has beaten
            os.kill(int(pid_file.read_text()), HANG_SIGNAL)
            _, err = job.communicate(timeout=90)
        finally:
            if job.poll() is None:
                os.killpg(job.pid, 9)
    assert job.returncode != 0
    assert "hang: no progress from rank(s) 0" in err, err[-2000:]
    reports = list((tmp_path / "logs").glob("*/attempt_*/hang_report.txt"))
    assert reports, err[-2000:]
    text = reports[0].read_text()
    assert "_hang" in text and "no Python stack" not in text, text
