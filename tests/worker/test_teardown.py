"""Each teardown guarantee alone, so that a broken one cannot hide behind another.

- SIGKILL after ``--shutdown-timeout`` for a worker that ignores SIGTERM.
- The launcher SIGKILLed: the guardian alone (the workers dropped their death signal) and
  ``PR_SET_PDEATHSIG`` alone (the launcher stopped, so that it cannot start a new guardian,
  and its guardian SIGKILLed first; warm, the template frozen) each leave no worker.
- The fork race: a launcher killed between a child's fork and its ``prctl`` (driven with
  ptrace by ``support/fork_race.py``): the child exits at once instead of running on.

In the warm start the workers' parent is the template, which would also kill them when the
agent's socket closes; the template is SIGSTOPped first so that path cannot do the work (a
stopped process still dies of SIGKILL, so its own death signal still fires; the kernel also
continues it, its group orphaned, but the SIGKILL came first). Where its own death signal is
the thing tested, it is frozen instead (see that test).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import psutil
import pytest

from phalanx.supervisor.cgroup import hierarchies
from support.freezer import frozen
from support.launch import (
    PHALANX,
    alive,
    read_pids,
    remove_job_cgroups,
    run_phalanx,
    wait_for,
    worker,
)

MODES = {"warm": [], "cold": ["--cold-start"]}
GONE_WAIT = 10.0  # only catches a survivor; SIGKILL delivery takes milliseconds


@pytest.mark.parametrize("mode", MODES)
def test_a_worker_ignoring_sigterm_is_sigkilled_after_the_shutdown_timeout(
    tmp_path: Path, mode: str
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    args = [*MODES[mode], "--nproc-per-node", "2", "--shutdown-timeout", "1",
            "--log-dir", str(tmp_path / "logs"), worker("ignore_sigterm.py"), str(out)]  # fmt: skip
    result = run_phalanx(args, timeout=120)
    stubborn = int((out / "stubborn.pid").read_text())
    try:
        assert result.returncode == 3, result.stderr  # the root cause's code
        assert (out / "sigterm").read_text() == "SIGTERM\n"  # SIGTERM came first, was ignored
        assert not alive(stubborn)
        report = result.stderr[result.stderr.index("=" * 78) :]
        assert "Root cause: rank 0 (local rank 0)" in report and "exit code 3" in report, report
        assert "stopped by phalanx (killed by SIGKILL)" in report, report
        (run_dir,) = (tmp_path / "logs").iterdir()
        data = json.loads((run_dir / "report.json").read_text())
        assert [e["rank"] for e in data["exits"] if e["stopped_by_launcher"]] == [1]
    finally:
        if alive(stubborn):
            os.kill(stubborn, signal.SIGKILL)


def _start(
    tmp_path: Path, flags: Sequence[str], child: bool, clear: bool
) -> tuple[subprocess.Popen[bytes], list[int], Path]:
    """One worker of ``deathsig_tree.py``: the launcher and the pids (worker, child) once up."""
    out = tmp_path / "out"
    out.mkdir()
    argv = [*PHALANX, *flags, "--nproc-per-node", "1", "--log-dir", str(tmp_path / "logs"),
            worker("deathsig_tree.py"), str(out), "child" if child else "none",
            "clear" if clear else "keep"]  # fmt: skip
    with open(tmp_path / "launcher.err", "wb") as stderr:
        launcher = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True
        )
    wait_for(lambda: len(read_pids(out)) == (2 if child else 1), 60, "the worker (and child)")
    return launcher, read_pids(out), out


def _helpers(launcher: subprocess.Popen[bytes]) -> tuple[psutil.Process, psutil.Process | None]:
    """The launcher's guardian (``python -I -S -c``) and, warm, its template."""
    children = psutil.Process(launcher.pid).children()
    (guardian,) = [c for c in children if c.cmdline()[1:3] == ["-I", "-S"]]
    templates = [c for c in children if "phalanx.worker.template" in " ".join(c.cmdline())]
    return guardian, (templates[0] if templates else None)


@pytest.fixture
def leftovers() -> Iterator[list[int]]:
    """Pids a test started indirectly; any still alive afterwards is SIGKILLed."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("mode", MODES)
def test_guardian_alone_ends_workers_and_children_when_the_launcher_is_killed(
    tmp_path: Path, mode: str, leftovers: list[int]
) -> None:
    """The workers clear their own death signal: only the guardian can end them."""
    launcher, pids, out = _start(tmp_path, MODES[mode], child=True, clear=True)
    leftovers.extend(pids)
    try:
        assert (out / "deathsig0").read_text() == f"{int(signal.SIGKILL)} 0"
        guardian, template = _helpers(launcher)
        leftovers.append(guardian.pid)
        assert (template is not None) == (mode == "warm")
        if template is not None:
            leftovers.append(template.pid)
            template.suspend()  # its own cleanup on the agent's EOF must not do the work
        launcher.kill()
        launcher.wait(10)
        wait_for(lambda: not any(alive(p) for p in pids), GONE_WAIT, "the guardian's SIGKILL")
        if template is not None:  # stopped, it still dies of its own death signal
            wait_for(lambda: not alive(template.pid), GONE_WAIT, "the template's death signal")
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait(10)


def test_the_guardian_removes_the_job_cgroup_while_the_killed_launcher_is_a_zombie(
    tmp_path: Path, leftovers: list[int]
) -> None:
    """The launcher is SIGKILLed and nobody reaps it: the guardian still ends the job and
    removes its cgroup (it waits for the launcher to finish dying, then retries the rmdir
    while a member killed a moment ago is still listed) -- no empty ``phalanx-*`` left."""
    launcher, pids, _ = _start(tmp_path, [], child=True, clear=True)
    leftovers.extend(pids)
    (run_dir,) = (tmp_path / "logs").iterdir()
    cgroups = [root / f"phalanx-{run_dir.name}" for root in hierarchies()]
    try:
        assert any(path.exists() for path in cgroups), "the job runs in a cgroup of its own"
        guardian, _ = _helpers(launcher)
        leftovers.append(guardian.pid)
        os.kill(launcher.pid, signal.SIGKILL)  # not Popen.kill: nothing may reap it yet
        wait_for(lambda: not any(alive(p) for p in pids), GONE_WAIT, "the guardian's SIGKILL")
        wait_for(lambda: not any(p.exists() for p in cgroups), GONE_WAIT, "the cgroup removed")
        assert psutil.Process(launcher.pid).status() == psutil.STATUS_ZOMBIE  # still unreaped
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait(10)


@pytest.mark.parametrize("mode", MODES)
def test_pdeathsig_alone_ends_the_workers_when_the_launcher_is_killed(
    tmp_path: Path, mode: str, leftovers: list[int]
) -> None:
    """The guardian is SIGKILLed first: only the death signal can end the worker (and, warm,
    the template, whose death in turn signals the worker). A worker's own children are the
    guardian's job, so this worker has none. The launcher is stopped before: running, it
    replaces a lost guardian at once, and the new one would do the work (the test passed with
    the death signals removed). Warm, the template is frozen (cgroup-v1 freezer), not
    stopped: the kernel continues a stopped process whose group the launcher's death
    orphans, and its own cleanup would do the work; frozen, it runs nothing, so a SIGKILL
    pending on it can only be its death signal, and thawed it dies of it."""
    launcher, pids, out = _start(tmp_path, MODES[mode], child=False, clear=False)
    leftovers.extend(pids)
    try:
        assert (out / "deathsig0").read_text() == f"{int(signal.SIGKILL)} {int(signal.SIGKILL)}"
        guardian, template = _helpers(launcher)
        assert (template is not None) == (mode == "warm")
        psutil.Process(launcher.pid).suspend()  # no replacement guardian
        if template is None:
            _kill_guardian_then_launcher(launcher, guardian)
        else:
            leftovers.append(template.pid)
            with frozen(template.pid, f"phalanx-test-pdeathsig-{template.pid}"):
                _kill_guardian_then_launcher(launcher, guardian)
                assert _sigkill_pending(template.pid), "the template got no death signal"
            # Thawed (and waited for by ``frozen``): it died of it, and signalled the worker.
        wait_for(lambda: not any(alive(p) for p in pids), GONE_WAIT, "the death signal")
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait(10)
        wait_for(lambda: not any(alive(p) for p in leftovers), GONE_WAIT, "the job to be gone")
        remove_job_cgroups(tmp_path / "logs")  # its guardian, which would have, was killed


def _kill_guardian_then_launcher(
    launcher: subprocess.Popen[bytes], guardian: psutil.Process
) -> None:
    guardian.kill()
    wait_for(lambda: not alive(guardian.pid), GONE_WAIT, "the guardian to die")
    launcher.kill()  # stopped, it still dies of SIGKILL
    launcher.wait(10)


def _sigkill_pending(pid: int) -> bool:
    """Whether SIGKILL is pending on ``pid`` (its thread's or its process's pending set)."""
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    pending = [int(line.split()[1], 16) for line in status if line.startswith(("SigPnd", "ShdPnd"))]
    return any(mask & (1 << (signal.SIGKILL - 1)) for mask in pending)


FORK_RACE = Path(__file__).parents[1] / "support" / "fork_race.py"


@pytest.mark.parametrize("mode", MODES)
def test_a_launcher_killed_between_fork_and_prctl_leaves_no_child(
    tmp_path: Path, mode: str
) -> None:
    """The fork race, driven with ptrace (see ``support/fork_race.py``): the first child of
    the launcher that asks for its death signal -- cold, a worker before its exec; warm, the
    template -- is held at that ``prctl`` while the launcher is SIGKILLed. Let go, the child
    must see its parent gone and exit 1 at once, not go on to run the worker."""
    out = tmp_path / "out"
    out.mkdir()
    argv = [*PHALANX, *MODES[mode], "--nproc-per-node", "1", "--log-dir", str(tmp_path / "logs"),
            worker("deathsig_tree.py"), str(out), "none", "keep"]  # fmt: skip
    try:
        done = subprocess.run(
            [sys.executable, str(FORK_RACE), "--", *argv],
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip
    finally:
        remove_job_cgroups(tmp_path / "logs")  # the race kills the guardian that would have
    assert done.returncode == 0, done.stderr
    race = json.loads(done.stdout.splitlines()[-1])
    assert race["launcher"] == signal.SIGKILL  # a wait status: killed by SIGKILL
    if mode == "warm":
        assert "phalanx.worker.template" in race["cmdline"]
    else:
        assert "--cold-start" in race["cmdline"]  # a fork of the launcher, before its exec
    assert race["syscalls"] == ["getppid", "exit_group"], race
    assert race["exit"] == 1
    assert read_pids(out) == []  # no worker ever started
