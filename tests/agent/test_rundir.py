"""The run directory is the user's alone (docs/tutorials/failure-report.md).

Real directories, real ownership (``chown`` to a uid nobody has), real symlinks, and the real
CLI for what a user sees. The suite runs as root, whom the kernel lets write anywhere, so each
check here holds only because phalanx makes it explicitly.
"""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from phalanx.errors import UsageError
from phalanx.resources.rundir import default_log_base, make_run_dir
from phalanx.worker.nofollow import SymlinkRefused, append_to, make_dirs, open_file, replace_file
from support.launch import PHALANX, launched, wait_for, worker

HANG = 60.0  # bounds that only catch a hang


def _unused_uid() -> int:
    for uid in range(12345, 12400):
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
    raise AssertionError("no unused uid in 12345..12399")


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")


@pytest.fixture
def tmpdir_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private ``TMPDIR`` for this test, for phalanx in this process and in subprocesses."""
    tmp = tmp_path / "tmp"
    tmp.mkdir(mode=0o755)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setenv("TMPDIR", str(tmp))
    return tmp


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# -- tier (b): the checks, on real directories ------------------------------------------------


def test_the_default_base_is_per_user_and_private(tmpdir_env: Path) -> None:
    base = tmpdir_env / f"phalanx-{os.geteuid()}"
    assert default_log_base() == base
    run_dir = make_run_dir(None, "job/1")
    assert run_dir.parent == base and run_dir.name.startswith("job_1_")
    for made in (base, run_dir):
        assert os.lstat(made).st_uid == os.geteuid()
        assert _mode(made) == 0o700
    assert make_run_dir(None, "job/1") != run_dir  # a fresh one each run


@needs_root
@pytest.mark.parametrize(
    ("prepare", "message"),
    [
        (lambda base: os.chown(base, _unused_uid(), -1), "it is owned by uid 123"),
        (lambda base: os.chmod(base, 0o777), "it may be written by group or others (mode 0777)"),
        (lambda base: os.chmod(base, 0o770), "it may be written by group or others (mode 0770)"),
    ],
    ids=["another-users", "mode-0777", "group-writable"],
)
def test_an_unsafe_default_base_is_refused(tmpdir_env: Path, prepare: object, message: str) -> None:
    base = default_log_base()
    base.mkdir(mode=0o700)
    prepare(base)  # type: ignore[operator]
    before = sorted(os.listdir(base))
    with pytest.raises(UsageError) as info:
        make_run_dir(None, "r")
    assert len(info.value.problems) == 1 and message in info.value.problems[0], info.value
    assert sorted(os.listdir(base)) == before  # nothing was made in it


def test_a_symlinked_or_non_directory_default_base_is_refused(tmpdir_env: Path) -> None:
    elsewhere = tmpdir_env / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    default_log_base().symlink_to(elsewhere)
    with pytest.raises(UsageError, match="it is a symbolic link"):
        make_run_dir(None, "r")
    assert os.listdir(elsewhere) == []
    default_log_base().unlink()
    default_log_base().write_text("a file")
    with pytest.raises(UsageError, match="it is not a directory"):
        make_run_dir(None, "r")


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o720], ids=["others", "group", "group-only"])
def test_a_tmpdir_others_may_write_needs_the_sticky_bit(tmpdir_env: Path, mode: int) -> None:
    """A group member may rename the default base away just as anyone could: a TMPDIR the
    group may write (a shared project's 0770 directory) needs the sticky bit too."""
    os.chmod(tmpdir_env, mode)
    with pytest.raises(UsageError, match=rf"has no sticky bit \(mode {mode:04o}\)"):
        make_run_dir(None, "r")
    assert not default_log_base().exists()
    os.chmod(tmpdir_env, 0o1000 | mode)  # /tmp's way: only a file's owner may rename it
    assert make_run_dir(None, "r").parent == default_log_base()


def test_an_explicit_log_dir(tmp_path: Path) -> None:
    # What exists is followed as given (a symlink the user named is theirs) ...
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "mine").symlink_to(real)
    run_dir = make_run_dir(tmp_path / "mine" / "new" / "deeper", "r")
    assert run_dir.parent == real / "new" / "deeper"  # resolved once: no symlink in it
    assert _mode(real / "new") == _mode(real / "new" / "deeper") == _mode(run_dir) == 0o700
    # A component phalanx would make that is a symlink (to where nothing is yet, so a
    # plain mkdir -p would make it there) is refused, and nothing is made through it.
    (tmp_path / "dangling").symlink_to(tmp_path / "target")
    with pytest.raises(UsageError, match="'dangling' in its path is a symbolic link"):
        make_run_dir(tmp_path / "dangling" / "logs", "r")
    assert not (tmp_path / "target").exists()
    # ... and a directory anyone may write to without the sticky bit is not used.
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(UsageError, match="may be written by anyone and has no sticky bit"):
        make_run_dir(shared, "r")
    os.chmod(shared, 0o1777)
    assert make_run_dir(shared, "r").parent == shared


def test_files_in_a_run_directory_never_go_through_a_symlink(tmp_path: Path) -> None:
    run_dir = make_run_dir(tmp_path, "r")
    victim_dir = tmp_path / "victim"
    victim_dir.mkdir()
    victim = victim_dir / "precious"
    victim.write_text("precious\n")
    # A planted directory: neither made through nor written through.
    (run_dir / "attempt_1").symlink_to(victim_dir)
    with pytest.raises(SymlinkRefused, match="'attempt_1' in its path is a symbolic link"):
        make_dirs(run_dir / "attempt_1" / "rank_0")
    with pytest.raises(SymlinkRefused):
        append_to(run_dir / "attempt_1" / "precious")
    # A planted file: appending refuses it, a whole-file write replaces the link itself.
    (run_dir / "stdout.log").symlink_to(victim)
    with pytest.raises(SymlinkRefused, match=r"'stdout\.log'"):
        append_to(run_dir / "stdout.log")
    with pytest.raises(FileExistsError):  # a file that must be new: the link is "there"
        open_file(run_dir / "stdout.log", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    (run_dir / "report.json").symlink_to(victim)
    replace_file(run_dir / "report.json", b"{}\n")
    assert not (run_dir / "report.json").is_symlink()
    assert (run_dir / "report.json").read_text() == "{}\n"
    assert victim.read_text() == "precious\n" and os.listdir(victim_dir) == ["precious"]
    assert [p for p in os.listdir(run_dir) if p.startswith(".")] == []  # no temporary left


# -- tier (c): what the user sees -------------------------------------------------------------


def _cli(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*PHALANX, "--nproc-per-node", "1", "--cold-start", *args],
        capture_output=True, text=True, timeout=HANG,
    )  # fmt: skip


@needs_root
def test_another_users_default_directory_fails_the_run_in_one_line(tmpdir_env: Path) -> None:
    base = default_log_base()
    base.mkdir(mode=0o755)
    os.chown(base, _unused_uid(), -1)
    done = _cli([worker("chatty.py"), "1"])
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert str(base) in lines[0] and "owned by uid" in lines[0] and "--log-dir" in lines[0]
    assert "Traceback" not in done.stderr and os.listdir(base) == []


def test_a_group_writable_tmpdir_without_the_sticky_bit_fails_the_run_in_one_line(
    tmpdir_env: Path,
) -> None:
    """TMPDIR (set for the CLI by the fixture) is a real 0770 directory: the run is refused
    before anything is made in it, in one line naming it, exit 2."""
    os.chmod(tmpdir_env, 0o770)
    done = _cli([worker("chatty.py"), "1"])
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert str(tmpdir_env) in lines[0] and "no sticky bit (mode 0770)" in lines[0], lines[0]
    assert "group or others" in lines[0] and "TMPDIR" in lines[0], lines[0]
    assert os.listdir(tmpdir_env) == []  # no phalanx-<uid> was made there


def test_a_world_writable_default_directory_fails_the_run_in_one_line(tmpdir_env: Path) -> None:
    base = default_log_base()
    base.mkdir()
    os.chmod(base, 0o777)
    done = _cli([worker("chatty.py"), "1"])
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "mode 0777" in lines[0], done.stderr
    assert os.listdir(base) == []


def test_a_symlink_swapped_in_for_report_json_leaves_its_target_untouched(
    tmpdir_env: Path, tmp_path: Path
) -> None:
    """The issue's attack: a symlink where root's report.json is about to be written, pointing
    at a root-owned file. The report is written beside it; the file stays as it was."""
    victim = tmp_path / "root-owned"
    victim.write_text("precious\n")
    os.chmod(victim, 0o644)
    gate = tmp_path / "gate"
    gate.mkdir()
    with launched(
        ["--nproc-per-node", "1", "--cold-start", worker("wait_then_fail.py"), str(gate)]
    ) as proc:
        wait_for(lambda: (gate / "ready").exists() or proc.poll() is not None, HANG, "the worker")
        runs = list(default_log_base().iterdir())
        assert len(runs) == 1, runs
        (runs[0] / "report.json").symlink_to(victim)
        (gate / "go").touch()
        _, err = proc.communicate(timeout=HANG)
    assert proc.returncode == 3, err
    assert victim.read_text() == "precious\n"
    report = runs[0] / "report.json"
    assert not report.is_symlink() and '"exit_code": 3' in report.read_text(), err
