"""Differential: inside a worker nothing differs from ``python -u script.py``.

One probe (``tests/workers/python_probe.py``) prints a JSON of everything a script can observe
of how it was started; it runs as rank 0 of a 1-worker phalanx job, warm, forked by the warm
service (``--keep-warm``: the second launch, the service already warm) and ``--cold-start``,
and under plain ``python -u`` with the very environment that worker had. The JSONs must be
equal but for the differences listed in ``DOCUMENTED``, each checked to be exactly that.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from support.launch import run_phalanx, worker
from support.services import end_services

MODES = {"warm": [], "service": ["--keep-warm", "600"], "cold": ["--cold-start"]}
WARM_LINE = "warm start: workers fork from template pid"
SERVICE_LINE = "warm service: workers fork from service pid"

# What a phalanx worker shows that plain python does not, and why. Everything else is equal.
DOCUMENTED = {
    # The worker-side code (phalanx.worker.boot; docs/how-to/hangs.md, "What a worker can
    # notice"): faulthandler is on, writing fatal-signal stacks and SIGUSR2 dumps to stacks.txt.
    "faulthandler": "documented: faulthandler.is_enabled() is True",
    "kernel_signals": "faulthandler catches the fatal signals and SIGUSR2 (documented)",
    "fds": "boot keeps stacks.txt (faulthandler's file) and the progress counters open",
    # The warm template (docs/explanation/design.md, "Warm start"): gc.freeze() before each
    # fork; OpenBLAS's idle pool thread (numpy, loaded by torch) stops in its pthread_atfork
    # handler and starts again on first use (phalanx.worker.template's docstring).
    "gc_frozen": "documented: the template calls gc.freeze() before each fork",
    "native_threads": "threads do not survive fork; OpenBLAS restarts its pool when used",
    # Values of one run: the run id and the rank's log directory are in these.
    "env": "compared by key; the reference is given the warm worker's own environment",
}
FAULTHANDLER_SIGNALS = (
    signal.SIGSEGV, signal.SIGFPE, signal.SIGABRT, signal.SIGBUS, signal.SIGILL, signal.SIGUSR2,
)  # fmt: skip


def probe_output(stdout: str) -> dict[str, Any]:
    (line,) = [line for line in stdout.splitlines() if "{" in line]
    data: dict[str, Any] = json.loads(line[line.index("{") :])
    return data


def mask(signals: tuple[signal.Signals, ...]) -> int:
    return sum(1 << (s - 1) for s in signals)


def check_documented(mode: str, ours: dict[str, Any], ref: dict[str, Any], rank_dir: Path) -> None:
    """Each documented difference is exactly what its reason says, no more."""
    assert ours["faulthandler"] is True and ref["faulthandler"] is False
    caught = int(ours["kernel_signals"].pop("SigCgt"), 16)
    assert caught == int(ref["kernel_signals"].pop("SigCgt"), 16) | mask(FAULTHANDLER_SIGNALS)
    assert ours["kernel_signals"] == ref["kernel_signals"]  # blocked and ignored: the same
    extra = {fd: path for fd, path in ours["fds"].items() if fd not in ref["fds"]}
    assert {fd: ours["fds"][fd] for fd in ref["fds"]} == ref["fds"]
    # the progress counters: the agent's memfd (phalanx.worker.progress), mapped
    assert sorted(p for p in extra.values() if p.startswith("/memfd:")) == [
        "/memfd:phalanx-progress (deleted)"
    ]
    files = [p for p in extra.values() if not p.startswith("/memfd:")]
    assert [Path(p).name for p in files] == ["stacks.txt"]
    assert all(Path(p).parent.samefile(rank_dir) for p in files)
    assert (ours["gc_frozen"], ref["gc_frozen"]) == (mode != "cold", False)
    if mode == "cold":
        assert ours["native_threads"] == ref["native_threads"]
    assert set(ours["env"]) == set(ref["env"])


@pytest.mark.parametrize("mode", MODES)
def test_a_worker_observes_what_python_u_gives_it(tmp_path: Path, mode: str) -> None:
    real = tmp_path / "real dir"
    real.mkdir()
    shutil.copy(worker("python_probe.py"), real / "probe.py")
    (tmp_path / "link dir").mkdir()
    script = "link dir/it's a probe.py"  # relative, a symlink, spaces and a quote
    (tmp_path / script).symlink_to(real / "probe.py")
    args = ["--lr", "0.1", "a b", "it's"]
    env = {**os.environ, "OMP_NUM_THREADS": "2"}  # a user's setting, passed through to torch
    command = [*MODES[mode], "--log-dir", "logs", script, *args]
    try:
        if mode == "service":  # the first launch starts the service; the second is measured
            assert run_phalanx(command, cwd=tmp_path, env=env).returncode == 0
        result = run_phalanx(command, cwd=tmp_path, env=env)
    finally:
        end_services(os.environ)
    assert result.returncode == 0, result.stderr
    assert (WARM_LINE in result.stderr) == (mode == "warm"), result.stderr
    assert (f"{SERVICE_LINE}" in result.stderr) == (mode == "service"), result.stderr
    assert mode != "service" or "already warm" in result.stderr
    ours = probe_output(result.stdout)

    # The reference: python -u in the same cwd, stdin from /dev/null, stdout and stderr pipes,
    # its own process group (phalanx gives each worker one: docs/tutorials/failure-report.md, "Supervision"), and the
    # environment the worker had (RANK, MASTER_ADDR, ... as phalanx set them).
    done = subprocess.run(
        [sys.executable, "-u", script, *args], cwd=tmp_path, env=ours["env"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120, process_group=0,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    ref = probe_output(done.stdout)
    assert ref["env"] == ours["env"]

    rank_dir = tmp_path / Path(ours["env"]["TORCHELASTIC_ERROR_FILE"]).parent  # relative: logs/
    check_documented(mode, ours, ref, rank_dir)
    differ = {key for key in ref if ours[key] != ref[key]}
    assert differ <= set(DOCUMENTED), {k: (ours[k], ref[k]) for k in differ - set(DOCUMENTED)}
    same = {key: ours[key] for key in set(ref) - set(DOCUMENTED)}
    assert same == {key: ref[key] for key in same}
    # The probe saw something: a spot check that the fields are the ones meant.
    assert ours["argv"] == [script, *args] and ours["name"] == "__main__"
    assert ours["threads"] == [2, ref["threads"][1]] and ours["omp"] == "2"
